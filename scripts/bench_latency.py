#!/usr/bin/env python3
"""Latency of a quantized model against its float model in onnxruntime (CPU, default session).

    python scripts/bench_latency.py FLOAT.onnx QUANT.onnx [--calib DIR] [--runs 50] [--threads N]

Feeds the first batch of ``--calib`` (a folder of .npz batches) or random data shaped like the
model's inputs (dynamic dimensions set to 1, or to --dim NAME=VALUE); warms up, then times
``--runs`` runs of each model alternately and prints the median milliseconds and the ratio
float / quantized (> 1: the quantized model is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def _session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feeds(sess: ort.InferenceSession, calib: Path | None, dims: dict[str, int]) -> dict:
    if calib is not None:
        first = sorted(calib.glob("*.npz"))[0]
        with np.load(first, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else dims.get(str(d), 1) for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 100, size=shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main(argv: list[str] | None = None) -> int:
    """Time both models and print the medians and their ratio."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("float_model", type=Path)
    p.add_argument("quant_model", type=Path)
    p.add_argument("--calib", type=Path)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    sessions = {"float": _session(args.float_model, args.threads),
                "int8": _session(args.quant_model, args.threads)}
    feeds = _feeds(sessions["float"], args.calib, dims)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(args.warmup):
        for sess in sessions.values():
            sess.run(None, feeds)
    for _ in range(args.runs):
        for name, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times[name].append((time.perf_counter() - t0) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.float_model.name}: float {med['float']:.2f} ms, int8 {med['int8']:.2f} ms "
          f"(median of {args.runs}), speed-up float/int8 = {med['float'] / med['int8']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
