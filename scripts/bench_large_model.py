"""Benchmark ``onnxq quantize`` on a (large) model: wall time and peak memory of the run.

Usage::

    python scripts/bench_large_model.py MODEL.onnx --calib-batches 8 [--backend B] [--keep]
                                        [--workdir DIR] [-- EXTRA ONNXQ ARGS]

Writes ``--calib-batches`` random N(0, 1) batches for the model's inputs (read from the header;
no weights are loaded), runs ``onnxq quantize`` (the CLI's ``main``) in a child process and
prints the model size (header + external data), the wall time, the child's peak RSS
(``os.wait4``'s ``ru_maxrss``) and the ratio peak RSS / model size.  While the child runs its
RSS is sampled from ``/proc``; each time it grows by another ``--stack-every`` MiB (and every
``--stack-period`` seconds, if given) the child dumps its Python stack (faulthandler on
SIGUSR1), so the report says *where* memory grew (and where the time goes).  On
failure the child's stderr tail (its traceback) is printed.  Output files are deleted unless
``--keep``.  Exit status: the child's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

MIB = 2**20
GIB = 2**30
CHILD = (
    "import faulthandler, signal, sys; "
    "faulthandler.register(signal.SIGUSR1, all_threads=False); "
    "from onnxq.cli import main; sys.exit(main())"
)


def model_files(model: Path) -> tuple[int, list[Path]]:
    """Total bytes of the model: the header plus every external data file it references."""
    import onnx

    header = onnx.load(str(model), load_external_data=False)
    files = {model}
    for t in header.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                files.add(model.parent / e.value)
    return sum(f.stat().st_size for f in files if f.exists()), sorted(files)


def write_calibration(model: Path, folder: Path, batches: int, seed: int = 0) -> None:
    import onnx
    from onnx import helper

    header = onnx.load(str(model), load_external_data=False)
    inits = {t.name for t in header.graph.initializer}
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(batches):
        batch = {}
        for vi in header.graph.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            batch[vi.name] = rng.standard_normal(shape).astype(dtype)
        np.savez(folder / f"{i:04d}.npz", **batch)


def rss_of(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 0


class Sampler(threading.Thread):
    """Samples the child's RSS; asks for a Python stack at each new high-water step."""

    def __init__(self, pid: int, step: int, started: float, period: float = 0.0):
        super().__init__(daemon=True)
        self.pid, self.step, self.started, self.period = pid, step, started, period
        self.samples: list[tuple[float, int]] = []
        self.marks: list[tuple[float, int]] = []  # (t, rss) when a stack was requested
        self.stop = threading.Event()

    def run(self) -> None:
        next_mark = self.step
        next_tick = self.period
        while not self.stop.wait(0.1):
            rss = rss_of(self.pid)
            if not rss:
                continue
            t = time.monotonic() - self.started
            self.samples.append((t, rss))
            grew = self.step and rss >= next_mark
            ticked = self.period and t >= next_tick
            if grew or ticked:
                self.marks.append((t, rss))
                if grew:
                    next_mark = (rss // self.step + 1) * self.step
                if ticked:
                    next_tick = t + self.period
                try:
                    os.kill(self.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    return


def stack_summaries(stderr: str) -> list[str]:
    """The innermost onnxq frame (and its caller chain) of each faulthandler dump."""
    out = []
    for dump in re.split(
        r"(?:Current thread 0x[0-9a-f]+|Stack) \(most recent call first\):", stderr
    )[1:]:
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', dump)
        ours = [f"{Path(f).name}:{n} {fn}" for f, n, fn in frames if "/onnxq/" in f]
        top = [f"{Path(f).name}:{n} {fn}" for f, n, fn in frames[:1]]
        out.append(" <- ".join(top + ours[:4]))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--calib-batches", type=int, default=8)
    p.add_argument("--backend", default="tensorrt", choices=("tensorrt", "onnxruntime"))
    p.add_argument(
        "--workdir",
        type=Path,
        help="where calibration data and the output go "
        "(default: a temporary folder next to the model)",
    )
    p.add_argument(
        "--stack-every",
        type=int,
        default=1024,
        help="MiB of RSS growth between Python stack dumps (0: none)",
    )
    p.add_argument(
        "--stack-period",
        type=float,
        default=0.0,
        help="also dump the Python stack every this many seconds (0: never): where the time goes",
    )
    p.add_argument("--keep", action="store_true", help="keep the output and calibration data")
    args = p.parse_args(argv)

    size, files = model_files(args.model)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="onnxq-bench-", dir=args.model.parent))
    work.mkdir(parents=True, exist_ok=True)
    calib = work / "calib"
    out = work / (args.model.stem + ".int8.onnx")
    write_calibration(args.model, calib, args.calib_batches)
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        "quantize",
        str(args.model),
        "-o",
        str(out),
        "--calib",
        str(calib),
        "--backend",
        args.backend,
        *extra,
    ]
    print(f"model: {args.model} ({size / GIB:.3f} GiB in {len(files)} file(s))")
    print("running: onnxq " + " ".join(cmd[3:]), flush=True)
    err_path = work / "stderr.txt"
    with open(err_path, "w") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        sampler = Sampler(proc.pid, args.stack_every * MIB, started, args.stack_period)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout = proc.stdout.read() if proc.stdout else ""
    stderr = err_path.read_text(errors="replace")
    peak = usage.ru_maxrss * 1024  # kB on Linux
    outputs = [f for f in (out, out.with_name(out.name + ".data")) if f.exists()]
    print(f"exit code: {proc.returncode}")
    print(f"model size: {size / GIB:.3f} GiB ({size} bytes)")
    print(f"wall time: {wall:.1f} s")
    print(f"peak RSS (child): {peak / GIB:.3f} GiB")
    print(f"peak RSS / model size: {peak / size:.2f}")
    print(f"cpu: user {usage.ru_utime:.1f} s, system {usage.ru_stime:.1f} s")
    if outputs:
        print(
            "output: " + ", ".join(f"{f.name} ({f.stat().st_size / GIB:.3f} GiB)" for f in outputs)
        )
    if sampler.samples:
        t_peak, r_peak = max(sampler.samples, key=lambda s: s[1])
        print(f"sampled RSS peak {r_peak / GIB:.3f} GiB at t={t_peak:.1f} s")
    for (t, rss), where in zip(sampler.marks, stack_summaries(stderr), strict=False):
        print(f"  RSS {rss / GIB:6.2f} GiB at t={t:6.1f} s: {where}")
    if stdout.strip():
        print("onnxq stdout:\n  " + "\n  ".join(stdout.strip().splitlines()[:20]))
    if proc.returncode != 0:
        lines = [
            ln
            for ln in stderr.splitlines()
            if ln.strip()
            and not ln.startswith(("Current thread", "  File", "Thread 0x", "Stack ("))
        ]
        print("onnxq stderr (tail):\n  " + "\n  ".join(lines[-25:]))
        tb = stderr.rfind("Traceback (most recent call last)")
        if tb >= 0:
            print("traceback:\n" + stderr[tb:])
    if not args.keep:
        for f in outputs:
            f.unlink()
        shutil.rmtree(calib, ignore_errors=True)
        err_path.unlink(missing_ok=True)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
