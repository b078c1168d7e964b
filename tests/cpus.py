"""The CPU class the tests run as (``ONNXQ_TARGET_CPU``, which CI sets to each class in turn) and
what this machine can check of it."""

from __future__ import annotations

import pytest

from onnxq.backends import cpu
from onnxq.backends.cpu import ENV_VAR, computes_here_as_there, this_machine


def skip_unless_fused_numerics_here(tuned: str | None = None) -> None:
    """Skip the rest of a test, its fused-kernel numerics, where onnxruntime on this machine
    cannot compute what an output tuned for ``tuned`` (default: the class the tests run as,
    ``ONNXQ_TARGET_CPU``) computes on its class: full-range int8 weights on a CPU whose u8 x s8
    kernels add int16 pairs.  What the test checked before (placement, weights, bits) has run."""
    target = this_machine().name if tuned is None else tuned
    if not computes_here_as_there(target):
        how = f"{ENV_VAR}={target}" if tuned is None else f"an output tuned for {target}"
        pytest.skip(
            f"{how} on a {cpu.detect()} machine: onnxruntime's u8 x s8 kernels here add pairs of "
            f"products in int16, which the full-range int8 weights of {target} overflow, so "
            "its fused numerics are checked on a machine of that class; its placement, "
            "weights and bits were checked here"
        )
