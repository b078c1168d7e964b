"""Automatic mixed precision (``--target``) in one process vs its calibration and sensitivity
trials as Ray tasks on a local Ray cluster: wall time, peak RSS per process, what a trial task
carries, and whether the outputs are byte-identical (docs/scale.md).

    python scripts/bench_ray_trials.py                    # mobilenet_v2, tensorrt, cosine=0.99
    python scripts/bench_ray_trials.py --target cosine=0.999 --workers 2 --repeats 3

The data is the zoo's calibration folder of the model (its first ``heldout_batches`` batches
are held out).  Each run is a fresh child process, the two kinds interleaved; Ray's start is
timed apart from the quantization.  Peak RSS is each process's high-water mark (``VmHWM``): the
driver, and each Ray worker.  The one-process run also records the pickled size of a trial's
context (sent once per worker on Ray) and of each trial task's argument and result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_ray import Recording, _cpu, ray_worker_peaks, start_ray
from zoo_paths import MODELS, calibration_folder

# the trials' default executor, recording what a Ray task would carry (one for the whole run)
RECORDED = Recording()


def _child(args: argparse.Namespace) -> None:
    """One run; prints a JSON line."""
    import onnxq
    import onnxq.mixed.sensitivity

    executor, startup = start_ray(args.workers) if args.child == "ray" else (None, 0.0)
    if executor is None:
        onnxq.mixed.sensitivity.InProcess = lambda: RECORDED  # type: ignore[attr-defined,assignment]
    began = time.perf_counter()
    result = onnxq.quantize(
        args.model,
        args.calib,
        backend=args.backend,
        target=args.target,
        progress=False,
        executor=executor,
    )
    wall = time.perf_counter() - began
    workers = ray_worker_peaks(executor)
    record = result.report.mixed_precision or {}
    line = {
        "kind": args.child,
        "wall_s": wall,
        "startup_s": startup,
        "driver_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_mib": workers,
        "sha256": hashlib.sha256(result.model.SerializeToString()).hexdigest(),
        "record": hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest(),
        "trials": record.get("trials"),
        "kept": [k["node"] for k in record.get("kept_float", [])],
        "score": record.get("score"),
        "travel": {
            "context": RECORDED.context,
            "shard_max": max(RECORDED.shards, default=0),
            "shard_median": statistics.median(RECORDED.shards or [0]),
            "result_max": max(RECORDED.results, default=0),
        },
    }
    print(json.dumps(line))


def _run(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, "--model", str(args.model)]
    command += ["--calib", str(args.calib), "--workers", str(args.workers)]
    command += ["--backend", args.backend, "--target", args.target]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0,):
        raise SystemExit(f"the {kind} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_run(kind: str, run: dict[str, Any]) -> None:
    workers = ", ".join(f"{v:.0f}" for v in run["worker_peak_mib"].values())
    print(
        f"  {kind:6s} wall {run['wall_s']:7.1f} s  (Ray start {run['startup_s']:.1f} s)"
        f"  driver peak {run['driver_peak_mib']:6.0f} MiB"
        + (f"  worker peaks [{workers}] MiB" if workers else "")
        + f"  {run['trials']} trials, {len(run['kept'])} kept float, score {run['score']}"
    )
    travel = run["travel"]
    if travel["context"]:
        kib = 1024
        print(
            f"         per trial task: {travel['shard_median'] / kib:.0f} KiB in (median; max "
            f"{travel['shard_max'] / kib:.0f} KiB), {travel['result_max']} bytes out; the "
            f"context (model, held-out batches, float outputs) "
            f"{travel['context'] / kib / kib:.1f} MiB once per worker"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MODELS / "mobilenet_v2.onnx"))
    parser.add_argument("--calib", help="calibration folder (default: the zoo's of the model)")
    parser.add_argument("--backend", default="tensorrt")
    parser.add_argument("--target", default="cosine=0.99")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", choices=["single", "ray"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.calib = args.calib or str(calibration_folder(Path(args.model).stem))
    if args.child:
        _child(args)
        return
    import onnxruntime

    import onnxq

    print(
        f"model {Path(args.model).stem}, --backend {args.backend} --target {args.target}, "
        f"calibration {args.calib}, Ray local cluster of {args.workers}"
    )
    print(
        f"CPU {_cpu()}, {os.cpu_count()} cores; onnxruntime {onnxruntime.__version__}; "
        f"onnxq {onnxq.__version__}; Python {platform.python_version()}"
    )
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "ray": []}
    for _ in range(args.repeats):
        for kind in ("single", "ray"):  # interleaved
            run = _run(kind, args)
            runs[kind].append(run)
            _print_run(kind, run)
    single = statistics.median(float(r["wall_s"]) for r in runs["single"])
    ray = statistics.median(float(r["wall_s"]) for r in runs["ray"])
    print(f"median wall: in one process {single:.1f} s, on Ray {ray:.1f} s (without Ray's start)")
    print(f"Ray / one process: {ray / single:.2f}x")
    every = [run for kind in runs for run in runs[kind]]
    same_model = len({run["sha256"] for run in every}) == 1
    same_record = len({run["record"] for run in every}) == 1
    print(f"outputs byte-identical across all runs: {'yes' if same_model else 'NO'}")
    print("  sha256 " + ", ".join(sorted({str(run["sha256"]) for run in every})))
    print(
        f"search records (ranking, kept layers, scores) identical: {'yes' if same_record else 'NO'}"
    )


if __name__ == "__main__":
    main()
