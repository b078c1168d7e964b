#!/usr/bin/env python3
"""Latency of a quantized model against its float model in onnxruntime (CPU, default session),
and against onnxruntime's own quantizer in the same run.

    python scripts/bench_latency.py FLOAT.onnx QUANT.onnx [--calib DIR] [--runs 50] [--repeat 5]
                                    [--threads N] [--peer ort|PEER.onnx|none] [--profile]

Feeds the first batch of ``--calib`` (a folder of .npz batches) or random data shaped like the
model's inputs (dynamic dimensions set to 1, or to --dim NAME=VALUE); warms up, then times
``--runs`` runs of each model alternately, ``--repeat`` times.  Each round gives a median per
model and a ratio float / quantized (> 1: the quantized model is faster); the line printed last
is the median over the rounds, with the rounds' range, so that a machine shared with other jobs
shows up as spread instead of as a wrong number.

``--peer ort`` (the default with ``--calib``) also quantizes FLOAT with onnxruntime's
``quantize_static`` (QDQ, uint8 activations, per-channel int8 weights, MinMax over the
``--calib`` batches, its defaults otherwise) and times it in the same rounds; ``--peer FILE``
times a model quantized elsewhere.  The last lines give onnxq / peer per round (< 1: onnxq's
output is faster).

``--profile`` also runs both models under onnxruntime's profiler and prints where the time goes
per op type (kernel time per run; the profiler adds a few microseconds per node, so use it for
shares, not for absolute latency).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def _session(path: Path, threads: int, profile_dir: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if profile_dir is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(profile_dir) / path.stem)
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


def time_alternating(
    sessions: dict[str, ort.InferenceSession],
    feeds: dict,
    runs: int,
) -> dict[str, float]:
    """Median milliseconds per session over ``runs`` runs, the sessions taking turns."""
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(runs):
        for name, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times[name].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def ort_quantize(float_model: Path, calib: Path, out: Path) -> Path:
    """onnxruntime's quantize_static: QDQ, uint8 activations, per-channel int8 weights."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.files = iter(sorted(calib.glob("*.npz")))

        def get_next(self) -> dict | None:
            path = next(self.files, None)
            if path is None:
                return None
            with np.load(path) as z:
                return {k: z[k] for k in z.files}

    quantize_static(
        str(float_model),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return out


def machine() -> str:
    """CPU model, onnxq's CPU class and onnxruntime's version, for the printout."""
    from onnxq.backends.cpu import this_machine
    from onnxq.backends.tune import cpu_model

    target = this_machine()
    return f"{cpu_model()} ({target.name}, {target.source}), onnxruntime {ort.__version__}"


def op_profile(path: Path, feeds: dict, runs: int, threads: int) -> dict[str, tuple[int, float]]:
    """Op type -> (node count, kernel microseconds per run) from onnxruntime's profiler."""
    with tempfile.TemporaryDirectory(prefix="onnxq-prof-") as tmp:
        sess = _session(path, threads, tmp)
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    total: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            total[op] += e["dur"]
            nodes[op].add(e["name"])
    return {op: (len(nodes[op]), us / runs) for op, us in total.items()}


def _print_profiles(paths: dict[str, Path], feeds: dict, runs: int, threads: int) -> None:
    for name, path in paths.items():
        prof = op_profile(path, feeds, runs, threads)
        total = sum(us for _, us in prof.values())
        print(f"profile {name} ({path.name}): kernels {total / 1000:.3f} ms per run")
        for op, (count, us) in sorted(prof.items(), key=lambda kv: -kv[1][1]):
            print(f"  {op:26s} x{count:<4d} {us:9.1f} us  {100 * us / total:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    """Time the models and print the medians and their ratios."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("float_model", type=Path)
    p.add_argument("quant_model", type=Path)
    p.add_argument("--calib", type=Path)
    p.add_argument("--runs", type=int, default=50, help="timed runs per model and round")
    p.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--peer",
        default=None,
        help="'ort' (default with --calib): onnxruntime's quantize_static output, made here; "
        "a path: a model quantized elsewhere; 'none': no peer",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also print onnxruntime's per-op-type kernel time for both models",
    )
    args = p.parse_args(argv)
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    paths = {"float": args.float_model, "int8": args.quant_model}
    with tempfile.TemporaryDirectory(prefix="onnxq-peer-") as tmp:
        peer = args.peer or ("ort" if args.calib is not None else "none")
        if peer == "ort":
            if args.calib is None:
                p.error("--peer ort needs --calib")
            paths["peer"] = ort_quantize(args.float_model, args.calib, Path(tmp) / "peer.onnx")
        elif peer != "none":
            paths["peer"] = Path(peer)
        _run(args, paths, dims)
    return 0


def _run(args: argparse.Namespace, paths: dict[str, Path], dims: dict[str, int]) -> None:
    sessions = {k: _session(v, args.threads) for k, v in paths.items()}
    feeds = _feeds(sessions["float"], args.calib, dims)
    for _ in range(args.warmup):
        for sess in sessions.values():
            sess.run(None, feeds)
    rounds = [time_alternating(sessions, feeds, args.runs) for _ in range(max(1, args.repeat))]
    ratios = [r["float"] / r["int8"] for r in rounds]
    med = {k: statistics.median(r[k] for r in rounds) for k in sessions}
    threads = f"{args.threads} thread(s)" if args.threads else "default threads"
    print(f"machine: {machine()}; {threads}")
    if len(rounds) > 1:
        print("rounds float/int8: " + " ".join(f"{x:.2f}" for x in ratios))
    print(
        f"{args.float_model.name}: float {med['float']:.3f} ms, int8 {med['int8']:.3f} ms "
        f"(median of {args.runs} runs x {len(rounds)} rounds), speed-up float/int8 = "
        f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}); "
        f"int8 at {1 / statistics.median(ratios):.2f}x of float"
    )
    if "peer" in sessions:
        versus = [r["int8"] / r["peer"] for r in rounds]
        of_float = statistics.median(r["peer"] / r["float"] for r in rounds)
        print(
            f"peer {paths['peer'].name}: {med['peer']:.3f} ms, at {of_float:.2f}x of float; "
            f"onnxq int8 / peer = {statistics.median(versus):.2f} (rounds "
            f"{min(versus):.2f}-{max(versus):.2f}; < 1: onnxq's output is faster)"
        )
    if args.profile:
        _print_profiles(paths, feeds, max(args.runs, 20), args.threads)


if __name__ == "__main__":
    sys.exit(main())
