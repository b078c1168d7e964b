#!/usr/bin/env python3
"""onnxruntime's float Conv against its int8 QLinearConv on this CPU: the measurements behind
the onnxruntime profile's cost thresholds (``min_macs_per_output``,
``min_macs_per_output_unaligned``; ``onnxq/place/rules/cost.py``).

    python scripts/bench_conv_kernels.py --kernel 1,3 --cin 3,8,10,12,16 --cout 16,32 --hw 56

For every combination it builds two one-conv models, ``x -> Conv -> y`` and the Q/DQ form
``x -> Q -> DQ -> Conv(DQ(int8 weight)) -> Q -> DQ -> y`` that onnxruntime fuses into a
QLinearConv, runs each under onnxruntime's profiler on one thread and prints the median kernel
time of the Conv node alone (no Q/DQ, layout or reorder nodes: inside a chain of convs those
are shared) and float / int8 (> 1: int8 is faster).  ``onnxq tune-cpu`` derives a cost table
from the same models timed with their Q/DQ; the numbers for the machine the shipped x86-vnni
table comes from are in git: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import onnxruntime as ort

from onnxq.backends.tune import ConvCase, conv_kernel_us, conv_model


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernel", type=_ints, default=[1, 3], help="kernel sizes (default 1,3)")
    ap.add_argument("--cin", type=_ints, default=[3, 4, 8, 10, 12, 16, 32], help="input channels")
    ap.add_argument("--cout", type=_ints, default=[16, 64], help="output channels")
    ap.add_argument("--hw", type=_ints, default=[56], help="input height = width")
    ap.add_argument("--runs", type=int, default=40, help="timed runs per model")
    args = ap.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, one thread; kernel time of the conv node, median")
    for kernel, cin, cout, hw in itertools.product(args.kernel, args.cin, args.cout, args.hw):
        case = ConvCase(cin, cout, kernel, hw)
        f, _ = conv_kernel_us(conv_model(case, False), case, args.runs)
        q, op = conv_kernel_us(conv_model(case, True), case, args.runs)
        print(
            f"k={kernel} cin={cin:4d} cout={cout:4d} hw={hw:4d} products/output="
            f"{cin * kernel * kernel:5d}  float {f:9.1f} us  int8 {q:9.1f} us ({op})  "
            f"float/int8 {f / q:5.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
