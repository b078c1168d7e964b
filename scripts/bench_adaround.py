"""AdaRound's per-layer optimisation: seconds per layer with numpy and with torch (when
installed), measured in the same process on layers of typical shapes, and the output error
each reaches against round-to-nearest.

Usage: ``python scripts/bench_adaround.py [--steps 500] [--repeat 3]``.  Prints one line per
layer shape: median seconds per engine, their ratio (numpy / torch) and the error ratios
(learned / nearest, lower is better).  Timings depend on the machine and on what else runs
on it: say which CPU, and compare engines only within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from onnxq.recover import rounding
from onnxq.recover.capture import GramStats

# (groups, outputs per group, K): a depthwise 3x3, a 1x1 conv, a 3x3 conv, a transformer FC
SHAPES = [(384, 1, 9), (1, 96, 576), (1, 128, 1152), (1, 384, 1536)]


def layer_problem(groups: int, outputs: int, k: int, rows: int = 4096) -> rounding.Problem:
    r = np.random.default_rng(0)
    mix = r.standard_normal((groups, k, k)).astype(np.float32) / np.sqrt(k)
    x = r.standard_normal((groups, rows, k)).astype(np.float32) @ mix
    w = (0.05 * r.standard_normal((groups, outputs, k))).astype(np.float32)
    scale = (np.abs(w).max(axis=2, keepdims=True) / 127).astype(np.float32)
    xt = x.astype(np.float64)
    return rounding.problem(w, scale, GramStats(xt.transpose(0, 2, 1) @ xt, rows=rows), 127)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    try:
        import torch  # noqa: F401

        engines = [("numpy", False), ("torch", True)]
    except ImportError:
        engines = [("numpy", False)]
    for shape in SHAPES:
        problem = layer_problem(*shape)
        nearest = problem.error(problem.nearest())
        times: dict[str, list[float]] = {name: [] for name, _ in engines}
        errors: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, use_torch in engines:  # interleaved, so load changes hit both
                start = time.perf_counter()
                learned = rounding.learn_rounding(problem, args.steps, use_torch)
                times[name].append(time.perf_counter() - start)
                errors[name] = problem.error(learned) / nearest
        medians = {name: statistics.median(t) for name, t in times.items()}
        line = f"groups={shape[0]:4d} outputs={shape[1]:4d} K={shape[2]:5d}:"
        for name, seconds in medians.items():
            line += f" {name} {seconds:7.2f} s (error x{errors[name]:.3f})"
        if "torch" in medians:
            line += f"  numpy/torch {medians['numpy'] / medians['torch']:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
