"""Print the CPU class onnxq targets on this machine: ``python -m onnxq.backends.which_cpu``.

One line: the class, where it came from (this machine, or ``$ONNXQ_TARGET_CPU``), and what it
covers.  A module of its own, so that ``-m`` does not run :mod:`onnxq.backends.cpu` a second
time (``import onnxq`` has loaded it already).
"""

from __future__ import annotations

from onnxq.backends.cpu import this_machine


def main() -> None:
    """Print this machine's class as onnxq treats it."""
    found = this_machine()
    print(f"{found.name} ({found.source}): {found.cpu.description}")


if __name__ == "__main__":
    main()
