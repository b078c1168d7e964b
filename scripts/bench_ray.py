"""Calibration in one process vs as Ray tasks on a local Ray cluster: wall time, peak RSS per
process, and whether the outputs are byte-identical (docs/scale.md).

    python scripts/bench_ray.py                      # ppocrv4_det, 256 batches, 2 workers
    python scripts/bench_ray.py --repeats 3 --workers 2 --batches 256

The calibration folder holds ``--batches`` batches (the zoo's batches of the model, repeated in
order; links, no copies).  Each run is a fresh child process, the two kinds interleaved, so that
one's memory does not carry into the other's figures; the ratio compares runs of this
invocation on this machine.  Ray's start (``ray.init``, workers) is timed apart from the
quantization.  Peak RSS is each process's high-water mark (``VmHWM``): the driver, and each
Ray worker that observed shards.
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
import tempfile
import time
from pathlib import Path
from typing import Any

from zoo_paths import MODELS, calibration_folder


def _cpu() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _peak_kib(pid: int) -> int:
    """A process's peak resident set (VmHWM) in KiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below ``root``."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        commands[int(entry.name)] = command
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = commands[child]
                frontier.append(child)
    return found


def start_ray(workers: int) -> tuple[Any, float]:
    """A local Ray executor of ``workers`` CPUs, started; and the seconds its start took."""
    from onnxq.scale import RayExecutor

    began = time.perf_counter()
    executor = RayExecutor("local", local_cpus=workers)
    parallel = executor.parallelism  # starts Ray
    assert parallel == workers, parallel
    return executor, time.perf_counter() - began


def ray_worker_peaks(executor: Any) -> dict[str, float]:
    """Peak RSS (MiB) of each Ray worker process under this one, then ``executor`` closed;
    ``{}`` for no executor."""
    if executor is None:
        return {}
    peaks = {}
    for pid, command in _descendants(os.getpid()).items():
        if command.startswith("ray::") and "Agent" not in command:
            peaks[f"{pid} {command.split()[0]}"] = _peak_kib(pid) / 1024
    executor.close()
    return peaks


def _child(args: argparse.Namespace) -> None:
    """One run; prints a JSON line."""
    import onnxq

    executor, startup = start_ray(args.workers) if args.child == "ray" else (None, 0.0)
    began = time.perf_counter()
    result = onnxq.quantize(args.model, args.calib, progress=False, executor=executor)
    wall = time.perf_counter() - began
    workers = ray_worker_peaks(executor)
    line = {
        "kind": args.child,
        "wall_s": wall,
        "startup_s": startup,
        "driver_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_mib": workers,
        "sha256": hashlib.sha256(result.model.SerializeToString()).hexdigest(),
    }
    print(json.dumps(line))


def _folder(model: str, batches: int, root: Path) -> Path:
    """``batches`` links to the zoo's batches of ``model``, repeated in order."""
    source = sorted(calibration_folder(model).glob("*.npz"))
    folder = root / f"{model}-{batches}"
    folder.mkdir()
    for k in range(batches):
        (folder / f"{k:05d}.npz").symlink_to(source[k % len(source)])
    return folder


class Recording:
    """An in-process executor that records the pickled size of what a Ray task would carry:
    the context (once per worker), each shard (the task's argument) and each result."""

    def __init__(self, shard_batches: int | None = None) -> None:
        from onnxq.scale import InProcess

        self.inner, self.shard_batches, self.parallelism = InProcess(), shard_batches, 1
        self.context = 0
        self.shards: list[int] = []
        self.results: list[int] = []

    def map(self, task, setup, context, shards):  # type: ignore[no-untyped-def]
        import pickle

        self.context = max(self.context, len(pickle.dumps(context)))

        def recorded():  # type: ignore[no-untyped-def]
            for shard in shards:
                self.shards.append(len(pickle.dumps(shard)))
                yield shard

        for result in self.inner.map(task, setup, context, recorded()):
            self.results.append(len(pickle.dumps(result)))
            yield result


def _travel(model: str, calib: Path, shard: int) -> str:
    """What travels per task, measured on the first 2 shards' worth of batches."""
    import onnxq

    small = calib.parent / "travel"
    small.mkdir()
    for path in sorted(calib.glob("*.npz"))[: 2 * shard]:
        (small / path.name).symlink_to(path.resolve())
    recording = Recording(shard)
    onnxq.quantize(model, small, progress=False, executor=recording)
    kib = 1024
    return (
        f"per task ({shard} batches/shard, folder source): shard {max(recording.shards) / kib:.0f}"
        f" KiB in, observer state {max(recording.results) / kib:.0f} KiB out; the model "
        f"{recording.context / kib / kib:.1f} MiB once per worker"
    )


def _run(kind: str, args: argparse.Namespace, calib: Path) -> dict[str, object]:
    command = [sys.executable, __file__, "--child", kind, "--model", str(args.model)]
    command += ["--calib", str(calib), "--workers", str(args.workers)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {kind} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MODELS / "ppocrv4_det.onnx"))
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", choices=["single", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--calib", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    import onnxruntime

    import onnxq

    name = Path(args.model).stem
    print(f"model {name}, {args.batches} calibration batches, Ray local cluster of {args.workers}")
    print(
        f"CPU {_cpu()}, {os.cpu_count()} cores; onnxruntime {onnxruntime.__version__}; "
        f"onnxq {onnxq.__version__}; Python {platform.python_version()}"
    )
    runs: dict[str, list[dict[str, object]]] = {"single": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        calib = _folder(name, args.batches, Path(tmp))
        print(_travel(args.model, calib, max(1, args.batches // (4 * args.workers))))
        for _ in range(args.repeats):
            for kind in ("single", "ray"):  # interleaved
                run = _run(kind, args, calib)
                runs[kind].append(run)
                workers = ", ".join(f"{v:.0f}" for v in run["worker_peak_mib"].values())  # type: ignore[attr-defined]
                print(
                    f"  {kind:6s} wall {run['wall_s']:7.1f} s  (Ray start {run['startup_s']:.1f} s)"
                    f"  driver peak {run['driver_peak_mib']:6.0f} MiB"
                    + (f"  worker peaks [{workers}] MiB" if workers else "")
                )
    hashes = {run["sha256"] for kind in runs for run in runs[kind]}
    single = statistics.median(float(r["wall_s"]) for r in runs["single"])  # type: ignore[arg-type]
    ray = statistics.median(float(r["wall_s"]) for r in runs["ray"])  # type: ignore[arg-type]
    print(f"median wall: in one process {single:.1f} s, on Ray {ray:.1f} s (without Ray's start)")
    print(f"Ray / one process: {ray / single:.2f}x")
    print(f"outputs byte-identical across all runs: {'yes' if len(hashes) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
