#!/usr/bin/env python3
"""Benchmark onnxq's calibration: wall time and peak RSS against onnxruntime and a float floor.

For one model and each N in ``--batches`` (N calibration batches, cycling through the files of
``--calib`` when it holds fewer), every measurement runs in its own child process, one after
another, timed with ``time.perf_counter`` and measured with ``os.wait4`` (``ru_maxrss``):

* ``onnxq total``: ``python -m onnxq.cli quantize MODEL -o OUT --calib DIR --method M -q``
  (loading, simplify, calibration, materialize and the fidelity validation);
* ``onnxq calib``: a small driver that prepares the model exactly as ``onnxq.api.quantize`` does
  (load, simplify, annotate, the observed tensors) and times only
  ``onnxq.calibrate.engine.calibrate`` (onnxruntime is imported before the clock starts, as in the
  floor);
* ``ort``: ``onnxruntime.quantization.quantize_static`` with the same method where it has one
  (MinMax, Percentile, Entropy; QDQ, per-channel, int8 symmetric activations and weights), fed
  by a CalibrationDataReader that loads the same npz files one at a time;
* ``floor``: the float model in an onnxruntime session (default options) over the same batches.

Every child gets ``--timeout`` seconds and an RSS cap (``--max-rss-mb``, enforced by polling
/proc/PID/status and killing; ``--rss-cap-mode rlimit`` uses RLIMIT_AS instead); a child that
hits them is reported as TIMEOUT / OOM.  Each calibrate()-only run is bracketed by floor runs
(floor, calib, floor, ...) and compared with the fastest of its own floors, so that a ratio
compares runs made under the same machine load; onnxq-minmax (every onnxq measurement with
``--repeat-all``) is repeated ``--repeat`` times and the fastest run is kept.  Children's CPU
time (``ru_utime + ru_stime``) is recorded too: on a shared machine it moves less than wall time.

To benchmark one fixed version while others commit, run it on a snapshot of the package:
``git archive HEAD onnxq | tar -x -C /tmp/snap``, ``cp onnxq/_histogram*.so /tmp/snap/onnxq/``
(the compiled counting loop that ``pip install -e .`` built; without it the snapshot counts
with numpy, slower) and ``PYTHONPATH=/tmp/snap python ...``.  The header says which ran.

    python scripts/bench_calibration.py                       # mobilenet_v2 from $ZOO_HOME
    python scripts/bench_calibration.py --model m.onnx --calib calib/ --batches 64,512 \
        --methods minmax,percentile,entropy,mse,auto --json bench.json
    python scripts/bench_calibration.py --profile percentile --batches 64   # where time goes
    python scripts/bench_calibration.py --batches 16 --methods minmax --no-ort  # quick check

Exit code 0 whatever the targets say (they are printed as PASS/FAIL); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

# the calibration engine's sources: a sampled stack through one of them is calibration's
ENGINE_FILES = tuple(
    f"onnxq/{name}.py"
    for name in ("calibrate", "calibration_observation", "calibration_batch", "calibration_session")
)
HISTOGRAM_METHODS = {"percentile", "entropy", "mse", "aciq", "auto"}
ORT_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
DEFAULT_METHODS = "minmax,percentile,entropy,mse,auto"
REPEATED = {"floor", "onnxq:minmax", "calib:minmax"}  # measured --repeat times, fastest kept
# targets
RSS_GROWTH_MAX = 1.10  # onnxq RSS at the largest N within 10% of the smallest N
ORT_SPEEDUP_MIN = 2.0  # onnxq at least 2x faster than onnxruntime, histogram methods
ORT_SPEEDUP_METHODS = ("percentile", "entropy")
FLOOR_RATIO_MINMAX = 1.5  # calibration alone vs the float inference floor
FLOOR_RATIO_HIST = 2.5


# --------------------------------------------------------------------------- child processes
@dataclass
class Run:
    """One child process: its status, wall time, peak RSS, and what it printed as JSON."""

    status: str  # ok | TIMEOUT | OOM | FAIL
    wall_s: float
    rss_mb: float
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    cpu_s: float = 0.0  # user + system time of the child (ru_utime + ru_stime)
    load1: float = 0.0  # the machine's 1-minute load average when the child started
    rss_runs: list[float] = field(default_factory=list)  # peak RSS of every repeat, MB


def _vm_rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _mem_available_kb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 1 << 62


def run_child(
    cmd: list[str],
    timeout: float,
    max_rss_mb: float,
    cap_mode: str,
    cwd: str,
    min_free_mb: float = 512.0,
) -> Run:
    """Run ``cmd``; wall time, ``ru_maxrss`` from ``os.wait4``; kill on timeout or RSS cap.

    The child's stdout is read as JSON lines (the drivers print one dict); stderr is kept for
    errors.  Besides the cap, the child is killed (as OOM) when the machine's MemAvailable
    drops under ``min_free_mb``, so a benchmark never takes the machine down.
    """
    cap_kb = int(max_rss_mb * 1024)

    def limit() -> None:  # in the child, before exec
        if cap_mode == "rlimit":
            resource.setrlimit(resource.RLIMIT_AS, (cap_kb * 1024, cap_kb * 1024))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        load1 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            preexec_fn=limit,
            start_new_session=True,
        )
        try:
            killed, wall, status, usage, peak_kb = _watch(
                proc.pid, t0, timeout, cap_kb, cap_mode, min_free_mb
            )
        except BaseException:  # interrupted: never leave a child behind
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        rss_mb = max(usage.ru_maxrss, peak_kb) / 1024.0
        cpu = usage.ru_utime + usage.ru_stime
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    info: dict[str, Any] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                info.update(json.loads(line))
    if killed:
        return Run(killed, wall, rss_mb, info, f"killed after {wall:.0f} s", cpu, load1)
    if proc.returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        oom = any(
            s in stderr
            for s in ("MemoryError", "bad_alloc", "Failed to allocate", "Cannot allocate memory")
        )
        return Run(
            "OOM" if oom else "FAIL",
            wall,
            rss_mb,
            info,
            f"exit {proc.returncode}: {tail[:400]}",
            cpu,
            load1,
        )
    return Run("ok", wall, rss_mb, info, "", cpu, load1)


def _watch(
    pid: int, t0: float, timeout: float, cap_kb: int, cap_mode: str, min_free_mb: float
) -> tuple[str, float, int, Any, int]:
    """Poll the child until it exits; kill its process group on timeout or memory.

    Returns (killed: "" | "TIMEOUT" | "OOM", wall seconds (to the kill, if killed), wait
    status, rusage from os.wait4, peak VmRSS seen by polling in KB).
    """
    killed = ""
    wall = 0.0
    peak = 0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done == pid:
            if not killed:
                wall = time.perf_counter() - t0
            return killed, wall, status, usage, peak
        rss = _vm_rss_kb(pid)
        peak = max(peak, rss)
        if not killed:
            if time.perf_counter() - t0 > timeout:
                killed = "TIMEOUT"
            elif (cap_mode == "poll" and rss > cap_kb) or _mem_available_kb() < min_free_mb * 1024:
                killed = "OOM"
            if killed:
                wall = time.perf_counter() - t0
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        time.sleep(0.05)


# --------------------------------------------------------------------------- child drivers
def child_floor(model: str, calib: str) -> None:
    """The float model in onnxruntime (default session options) over every batch."""
    import numpy as np
    import onnxruntime as ort

    t0, c0 = time.perf_counter(), time.process_time()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    n = 0
    for path in _npz_files(calib):
        with np.load(path, allow_pickle=False) as z:
            feed = {k: z[k] for k in z.files}
        session.run(None, feed)
        n += 1
    t2, c2 = time.perf_counter(), time.process_time()
    print(
        json.dumps(
            {
                "inner_s": t2 - t0,
                "session_s": t1 - t0,
                "loop_s": t2 - t1,
                "inner_cpu_s": c2 - c0,
                "batches": n,
            }
        )
    )


def child_ort(model: str, calib: str, method: str, out: str) -> None:
    """onnxruntime's quantize_static: QDQ, per-channel, int8 symmetric; one npz at a time."""
    import numpy as np
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self, files: list[Path]):
            self.files = iter(files)

        def get_next(self) -> dict[str, Any] | None:
            path = next(self.files, None)
            if path is None:
                return None
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}

    t0 = time.perf_counter()
    quantize_static(
        model,
        out,
        Reader(_npz_files(calib)),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
        extra_options={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            # onnxq's default percentile (onnxruntime's own default is 99.999)
            "CalibPercentile": 99.99,
        },
    )
    print(json.dumps({"inner_s": time.perf_counter() - t0}))


def _observed_tensors(annotations: Any) -> dict[str, bool]:
    from onnxq.place.loop import observed_tensors

    return observed_tensors(annotations)


def _prepare(model: str, calib: str, method: str) -> tuple[Any, ...]:
    """What onnxq.api.quantize does before its first calibrate() call."""
    from onnxq import ir
    from onnxq.api import resolve_config
    from onnxq.backends.target import profile_for
    from onnxq.data.sources import model_inputs, open_source
    from onnxq.place.engine import annotate
    from onnxq.place.facts import GraphFacts
    from onnxq.prepare.simplify import simplify
    from onnxq.prepare.stage import load

    cfg = resolve_config(None, method=method, progress=False)
    profile, _ = profile_for(cfg.target)
    loaded, _source = load(model, profile)
    reference = ir.serialize(loaded) if ir.model_nbytes(loaded) < ir.PROTO_LIMIT else None
    if cfg.simplify:
        loaded, _passes = simplify(loaded)
    graph = ir.Graph(loaded)
    inputs = model_inputs(graph)
    data = open_source(calib, inputs, 1)
    annotations = annotate(GraphFacts.of(graph, profile), profile, cfg.placement)
    wanted = _observed_tensors(annotations)
    return cfg, loaded, data, inputs, wanted, reference


def child_calib(model: str, calib: str, method: str, profile_out: str | None = None) -> None:
    """Time only onnxq.calibrate.engine.calibrate(), after the same preparation as the API."""
    import onnxruntime  # noqa: F401  # imported before the clock, as child_floor does

    from onnxq.calibrate.engine import calibrate

    t0 = time.perf_counter()
    cfg, loaded, data, inputs, wanted, _reference = _prepare(model, calib, method)
    t1 = time.perf_counter()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def call() -> Any:
        return calibrate(
            loaded,
            wanted,
            data,
            inputs,
            max_batches=cfg.max_batches,
            hold=cfg.fidelity_batches,
            memory_budget=cfg.memory_budget_mb * 2**20,
            histogram_sample=cfg.histogram_sample,
            histogram_budget=cfg.histogram_budget,
            progress=False,
        )

    if profile_out:
        import cProfile

        prof = cProfile.Profile()
        t2, c2 = time.perf_counter(), time.process_time()
        result = prof.runcall(call)
        t3, c3 = time.perf_counter(), time.process_time()
        prof.dump_stats(profile_out)
    else:
        t2, c2 = time.perf_counter(), time.process_time()
        result = call()
        t3, c3 = time.perf_counter(), time.process_time()
    print(
        json.dumps(
            {
                "prepare_s": t1 - t0,
                "calib_s": t3 - t2,
                "calib_cpu_s": c3 - c2,
                "batches": result.batches_seen,
                "observed": len(wanted),
                "histograms": sum(wanted.values()),
                "rss_before_calib_mb": rss_before / 1024.0,
                "rss_after_calib_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            }
        )
    )


def _npz_files(folder: str) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.suffix == ".npz")


# --------------------------------------------------------------------------- parent
def make_calib_dir(src: Path, n: int, root: Path) -> Path:
    """A folder of ``n`` symlinks 0000.npz.. cycling through ``src``'s npz files."""
    files = _npz_files(str(src))
    if not files:
        raise SystemExit(f"bench_calibration: no .npz files in {src}")
    out = root / f"calib_{n}"
    out.mkdir()
    width = max(4, len(str(n - 1)))
    for i in range(n):
        (out / f"{i:0{width}d}.npz").symlink_to(files[i % len(files)].resolve())
    return out


def machine_facts() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(Exception), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    facts: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }
    with contextlib.suppress(Exception), open("/proc/meminfo") as f:
        facts["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    for mod in ("onnxruntime", "numpy", "onnx", "onnxq"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception:
            facts[mod] = "?"
    with contextlib.suppress(Exception):
        where = Path(str(__import__("onnxq").__file__)).parent
        facts["onnxq_path"] = str(where)
        # the same counts either way, but not the same time (docs/calibration.md)
        native = __import__("onnxq.numerics.observers", fromlist=["_native"])._native
        facts["histogram_counting"] = "compiled (onnxq.numerics._histogram)" if native else "numpy"
        facts["onnxq_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=where,
            check=False,
        ).stdout.strip()
    return facts


def measure(
    key: str,
    cmd: list[str],
    args: argparse.Namespace,
    cwd: str,
    log: list[str],
    repeats: int | None = None,
) -> Run:
    """Run ``cmd`` ``repeats`` times (default: ``--repeat`` for floor and onnxq-minmax, else 1)
    and keep the fastest run that finished."""
    if repeats is None:
        repeats = args.repeat if _repeated(key, args) else 1
    best: Run | None = None
    for r in range(repeats):
        run = run_child(cmd, args.timeout, args.max_rss_mb, args.rss_cap_mode, cwd)
        t = _time_of(run, key)
        msg = (
            f"  {key:<22} run {r + 1}/{repeats}: {run.status:<7} wall {run.wall_s:7.2f} s"
            f"  rss {run.rss_mb:8.1f} MB"
            + (f"  inner {t:7.2f} s" if t is not None else "")
            + f"  cpu {run.cpu_s:7.2f} s  load {run.load1:4.1f}"
            + (f"  {run.error}" if run.error else "")
        )
        print(msg, flush=True)
        log.append(msg)
        best = _best(best, run, key)
        if run.status != "ok":
            break
    assert best is not None
    return best


def _repeated(key: str, args: argparse.Namespace) -> bool:
    return key in REPEATED or (args.repeat_all and not key.startswith("ort:"))


def _best(best: Run | None, run: Run, key: str) -> Run:
    """The faster of two runs (a finished one over a killed one), carrying every run's RSS."""
    seen = (best.rss_runs if best else []) + (run.rss_runs or [run.rss_mb])
    if best is None or (
        run.status == "ok" and (best.status != "ok" or _cmp(run, key) < _cmp(best, key))
    ):
        best = run
    best.rss_runs = seen
    return best


def _time_of(run: Run, key: str) -> float | None:
    if key.startswith("calib"):
        return run.info.get("calib_s")
    return run.info.get("inner_s")


def _cmp(run: Run, key: str) -> float:
    t = _time_of(run, key) if key.startswith(("calib", "floor")) else None
    return t if t is not None else run.wall_s


def bench(args: argparse.Namespace) -> dict[str, Any]:
    me = str(Path(__file__).resolve())
    py = sys.executable
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    sizes = sorted({int(n) for n in args.batches.split(",") if n.strip()})
    results: dict[str, Any] = {
        "machine": machine_facts(),
        "model": str(args.model),
        "calib": str(args.calib),
        "methods": methods,
        "batches": sizes,
        "timeout_s": args.timeout,
        "max_rss_mb": args.max_rss_mb,
        "no_ort": args.no_ort,
        "argv": sys.argv,
        "runs": {},
    }
    print(json.dumps(results["machine"]), flush=True)
    log: list[str] = []
    with tempfile.TemporaryDirectory(prefix="onnxq-bench-") as tmp:
        root = Path(tmp)
        for n in sizes:
            calib = str(make_calib_dir(Path(args.calib), n, root))
            print(f"N = {n}: {calib}", flush=True)

            def put(key: str, run: Run, n: int = n) -> None:
                results["runs"][f"{key}@{n}"] = asdict(run)

            floor_cmd = [py, me, "--child", "floor", str(args.model), calib]
            floor_all: Run | None = None
            for m in methods:
                out = str(root / f"onnxq_{m}_{n}.onnx")
                put(
                    f"onnxq:{m}",
                    measure(
                        f"onnxq:{m}",
                        [
                            py,
                            "-m",
                            "onnxq.cli",
                            "quantize",
                            str(args.model),
                            "-o",
                            out,
                            "--calib",
                            calib,
                            "--method",
                            m,
                            "-q",
                        ],
                        args,
                        tmp,
                        log,
                    ),
                )
                # calibrate() alone, bracketed by float-floor runs so that the ratio compares
                # runs made under the same machine load: floor, calib, [floor, calib,] floor
                reps = args.repeat if _repeated(f"calib:{m}", args) else 1
                floor = calib_run = None
                for _ in range(reps):
                    floor = _best(
                        floor, measure(f"floor:{m}", floor_cmd, args, tmp, log, 1), "floor"
                    )
                    calib_run = _best(
                        calib_run,
                        measure(
                            f"calib:{m}",
                            [py, me, "--child", "calib", str(args.model), calib, m],
                            args,
                            tmp,
                            log,
                            1,
                        ),
                        "calib",
                    )
                floor = _best(floor, measure(f"floor:{m}", floor_cmd, args, tmp, log, 1), "floor")
                assert floor is not None and calib_run is not None
                put(f"floor:{m}", floor)
                put(f"calib:{m}", calib_run)
                floor_all = _best(floor_all, floor, "floor")
                put("floor", floor_all)
                if m in ORT_METHODS and not args.no_ort:
                    out = str(root / f"ort_{m}_{n}.onnx")
                    put(
                        f"ort:{m}",
                        measure(
                            f"ort:{m}",
                            [py, me, "--child", "ort", str(args.model), calib, m, out],
                            args,
                            tmp,
                            log,
                        ),
                    )
                for f in root.glob("*.onnx*"):
                    f.unlink()
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["machine"]["onnxq_commit_end"] = machine_facts()["onnxq_commit"]
    results["log"] = log
    return results


# --------------------------------------------------------------------------- report
def _get(results: dict[str, Any], key: str, n: int) -> dict[str, Any] | None:
    return results["runs"].get(f"{key}@{n}")


def _fmt_t(run: dict[str, Any] | None, field_: str | None = None) -> str:
    if run is None:
        return "-"
    if run["status"] != "ok":
        return f"{run['status']} (>{run['wall_s']:.0f})"
    v = run["wall_s"] if field_ is None else run["info"].get(field_)
    return "-" if v is None else f"{v:.2f}"


def _rss(run: dict[str, Any]) -> float:
    """Peak RSS of a measurement: the least over its repeats (the jitter between repeats of
    the same run, tens of MB, comes from allocator and thread timing, not from N)."""
    return min(run.get("rss_runs") or [run["rss_mb"]])


def _fmt_mb(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    s = f"{_rss(run):.0f}"
    if run["status"] != "ok":
        return f"{run['status']} (>{run['rss_mb']:.0f})"
    many = run.get("rss_runs") or []
    return f"{s}-{max(many):.0f}" if len(many) > 1 and max(many) - min(many) >= 1 else s


def _ok(run: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return run is not None and run["status"] == "ok"


def table(results: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The markdown table, and the target lines (PASS/FAIL)."""
    sizes, methods = results["batches"], results["methods"]
    head = [
        "method",
        "N",
        "onnxq s",
        "onnxq MB",
        "calib s",
        "calib MB",
        "ort s",
        "ort MB",
        "floor s",
        "floor run s",
        "calib/floor",
        "ort/onnxq",
        "RSS(max N)/RSS(min N)",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    targets: list[str] = []
    lo, hi = sizes[0], sizes[-1]
    for m in methods:
        for n in sizes:
            q, c, o = (_get(results, k, n) for k in (f"onnxq:{m}", f"calib:{m}", f"ort:{m}"))
            f = _get(results, f"floor:{m}", n) or _get(results, "floor", n)
            ratio_floor = "-"
            if _ok(c) and _ok(f):
                ratio_floor = f"{c['info']['calib_s'] / f['info']['inner_s']:.2f}"
            ratio_ort = "-"
            if _ok(q) and o is not None:
                ratio_ort = f"{o['wall_s'] / q['wall_s']:.2f}" if _ok(o) else f"ort {o['status']}"
            growth = "-"
            if n == hi and len(sizes) > 1:
                q0 = _get(results, f"onnxq:{m}", lo)
                if _ok(q) and _ok(q0):
                    growth = f"{_rss(q) / _rss(q0):.3f}"
            rows.append(
                "| "
                + " | ".join(
                    [
                        m,
                        str(n),
                        _fmt_t(q),
                        _fmt_mb(q),
                        _fmt_t(c, "calib_s"),
                        _fmt_mb(c),
                        _fmt_t(o) if m in ORT_METHODS else "n/a",
                        _fmt_mb(o) if m in ORT_METHODS else "n/a",
                        _fmt_t(f),
                        _fmt_t(f, "inner_s"),
                        ratio_floor,
                        ratio_ort,
                        growth,
                    ]
                )
                + " |"
            )
    # targets
    if len(sizes) > 1:
        for m in methods:
            for key, label in ((f"onnxq:{m}", "onnxq"), (f"calib:{m}", "calib-only")):
                a, b = _get(results, key, lo), _get(results, key, hi)
                if _ok(a) and _ok(b):
                    g = _rss(b) / _rss(a)
                    verdict = "PASS" if g <= RSS_GROWTH_MAX else "FAIL"
                    worst = max(b.get("rss_runs") or [b["rss_mb"]]) / _rss(a)
                    targets.append(
                        f"{verdict}  {m:<10} {label} RSS N={hi} / N={lo} = {g:.3f} "
                        f"({_rss(b):.0f} / {_rss(a):.0f} MB, least of the repeats; "
                        f"worst repeat {worst:.3f}; target <= {RSS_GROWTH_MAX})"
                    )
                else:
                    targets.append(f"FAIL  {m:<10} {label} RSS growth: a run did not finish")
    for m in methods:
        if m not in ORT_SPEEDUP_METHODS:
            continue
        for n in sizes:
            q, o = _get(results, f"onnxq:{m}", n), _get(results, f"ort:{m}", n)
            if o is None and results.get("no_ort"):
                continue
            if not _ok(q) or o is None:
                targets.append(f"FAIL  {m:<10} N={n} ort speedup: onnxq or ort did not run")
            elif not _ok(o):
                targets.append(
                    f"PASS  {m:<10} N={n} onnxruntime {o['status']} after "
                    f"{o['wall_s']:.0f} s / {o['rss_mb']:.0f} MB; onnxq "
                    f"{q['wall_s']:.1f} s / {_rss(q):.0f} MB (target ort/onnxq "
                    f">= {ORT_SPEEDUP_MIN})"
                )
            else:
                r = o["wall_s"] / q["wall_s"]
                verdict = "PASS" if r >= ORT_SPEEDUP_MIN else "FAIL"
                targets.append(
                    f"{verdict}  {m:<10} N={n} ort/onnxq time = {r:.2f} "
                    f"({o['wall_s']:.1f} / {q['wall_s']:.1f} s; target >= "
                    f"{ORT_SPEEDUP_MIN})"
                )
    for m in methods:
        limit = (
            FLOOR_RATIO_MINMAX
            if m == "minmax"
            else (FLOOR_RATIO_HIST if m in HISTOGRAM_METHODS else None)
        )
        if limit is None:
            continue
        for n in sizes:
            c = _get(results, f"calib:{m}", n)
            f = _get(results, f"floor:{m}", n) or _get(results, "floor", n)
            if not (_ok(c) and _ok(f)):
                targets.append(f"FAIL  {m:<10} N={n} floor ratio: a run did not finish")
                continue
            r = c["info"]["calib_s"] / f["info"]["inner_s"]
            verdict = "PASS" if r <= limit else "FAIL"
            cpu = ""
            if c["info"].get("calib_cpu_s") and f["info"].get("inner_cpu_s"):
                cpu = f"; CPU-time ratio {c['info']['calib_cpu_s'] / f['info']['inner_cpu_s']:.2f}"
            targets.append(
                f"{verdict}  {m:<10} N={n} calibrate() / floor = {r:.2f} "
                f"({c['info']['calib_s']:.2f} / {f['info']['inner_s']:.2f} s; target "
                f"<= {limit}{cpu})"
            )
    return rows, targets


# --------------------------------------------------------------------------- profile
def profile(args: argparse.Namespace) -> None:
    """Profile the calibrate() driver at the smallest N: where the calibration time goes.

    With py-spy (default when installed): sampled stacks, attributed to the innermost onnxq
    source line (a numpy call such as ``np.bincount`` shows as the line that makes it), which
    cProfile cannot split (numpy's C functions count as their caller's own time there), on
    every thread (cProfile sees only the main thread: work that calibrate() hands to a worker
    thread shows there as waiting on a lock).
    """
    import shutil

    n = sorted(int(x) for x in args.batches.split(","))[0]
    me = str(Path(__file__).resolve())
    use_spy = args.profiler == "py-spy" or (args.profiler == "auto" and shutil.which("py-spy"))
    with tempfile.TemporaryDirectory(prefix="onnxq-bench-") as tmp:
        calib = make_calib_dir(Path(args.calib), n, Path(tmp))
        driver = [sys.executable, me, "--child", "calib", str(args.model), str(calib), args.profile]
        if use_spy:
            raw = Path(tmp) / "spy.txt"
            cmd = ["py-spy", "record", "-r", "250", "-f", "raw", "-o", str(raw), "--", *driver]
        else:
            raw = Path(tmp) / "calib.prof"
            cmd = [*driver, str(raw)]
        run = run_child(cmd, args.timeout, args.max_rss_mb, args.rss_cap_mode, tmp)
        if run.status != "ok" or "calib_s" not in run.info:
            raise SystemExit(f"bench_calibration: profiled run {run.status}: {run.error}")
        total = run.info["calib_s"]
        print(
            f"method {args.profile}, N={n}: calibrate() {total:.2f} s while profiled "
            f"({run.info['observed']} tensors observed, {run.info['histograms']} with a "
            f"histogram; load {run.load1:.1f})"
        )
        if use_spy:
            _report_spy(raw, args.top)
        else:
            _report_cprofile(raw, total, args.top)
        if args.profile_out:
            shutil.copy(raw, args.profile_out)


def _report_spy(raw: Path, top: int) -> None:
    """Shares of the samples taken inside calibrate(), on the main thread or on a statistics
    worker thread (a stack through the engine's files, ``ENGINE_FILES``), by innermost onnxq
    source line."""
    import collections
    import linecache
    import re

    import onnxq

    root = Path(onnxq.__file__).resolve().parent.parent
    frame = re.compile(r"^(.*) \((.*):(\d+)\)$")
    lines: collections.Counter[tuple[str, str, int]] = collections.Counter()
    funcs: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for row in raw.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        frames = [frame.match(f) for f in stack.split(";")]
        parsed = [(m.group(1), m.group(2), int(m.group(3))) for m in frames if m]
        at = [i for i, f in enumerate(parsed) if f[1].replace("\\", "/").endswith(ENGINE_FILES)]
        if not at:
            continue
        k = int(count)
        total += k
        main = any(f[0] == "calibrate" for f in parsed[: at[0] + 1])
        threads["main thread (calibrate loop)" if main else "worker thread (statistics)"] += k
        mine = [f for f in parsed[at[0] :] if "onnxq/" in f[1].replace("\\", "/")]
        leaf = mine[-1] if mine else parsed[-1]
        lines[leaf] += k
        funcs[leaf[0]] += k
    if not total:
        print("no samples inside calibrate()")
        return
    print(f"{total} busy samples inside calibrate() (all threads; idle waits not sampled):")
    for name, k in threads.most_common():
        print(f"{100 * k / total:5.1f}%  {name}")
    print("by innermost onnxq source line:")
    print(f"{'share':>6}  where                                  code")
    for (fn, file, line), k in lines.most_common(top):
        path = Path(file) if Path(file).is_absolute() else root / file
        code = linecache.getline(str(path), line).strip()
        print(f"{100 * k / total:5.1f}%  {f'{fn} ({Path(file).name}:{line})':<38} {code[:70]}")
    print("by function:")
    for fn, k in funcs.most_common(8):
        print(f"{100 * k / total:5.1f}%  {fn}")


def _report_cprofile(stats_file: Path, total: float, top: int) -> None:
    import pstats

    st = pstats.Stats(str(stats_file))
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{Path(file).name}:{line}({fn})"))
    print(f"{'self s':>8} {'self %':>7} {'cum s':>8} {'cum %':>7} {'calls':>8}  function")
    for tt, ct, nc, name in sorted(rows, reverse=True)[:top]:
        print(
            f"{tt:8.2f} {100 * tt / total:6.1f}% {ct:8.2f} {100 * ct / total:6.1f}% {nc:8d}  {name}"
        )


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, rest = argv[1], argv[2:]
        if kind == "floor":
            child_floor(*rest)
        elif kind == "ort":
            child_ort(*rest)
        else:
            child_calib(*rest)
        return 0
    zoo = Path(os.environ.get("ZOO_HOME", "~/zoo")).expanduser()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        type=Path,
        default=zoo / "models" / "mobilenet_v2.onnx",
        help="float ONNX model (default: $ZOO_HOME/models/mobilenet_v2.onnx)",
    )
    p.add_argument(
        "--calib",
        type=Path,
        default=None,
        help="folder of .npz batches (default: ~/zw/calib/<model stem>)",
    )
    p.add_argument("--batches", default="64,512", help="comma-separated N (default 64,512)")
    p.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated onnxq methods (default {DEFAULT_METHODS})",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child (900)")
    p.add_argument("--max-rss-mb", type=float, default=16384.0, help="RSS cap per child (16 GB)")
    p.add_argument(
        "--rss-cap-mode",
        choices=("poll", "rlimit"),
        default="poll",
        help="poll /proc/PID/status and kill (default), or RLIMIT_AS in the child",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=2,
        help="runs of the floor and onnxq-minmax measurements (fastest kept)",
    )
    p.add_argument(
        "--repeat-all",
        action="store_true",
        help="repeat every onnxq measurement (and its floor pairs), not only minmax",
    )
    p.add_argument("--no-ort", action="store_true", help="skip onnxruntime's quantize_static")
    p.add_argument("--json", type=Path, help="write all measurements to this JSON file")
    p.add_argument(
        "--table",
        type=Path,
        metavar="JSON",
        help="only print the table and targets of a JSON written by --json",
    )
    p.add_argument(
        "--profile",
        metavar="METHOD",
        help="instead of benchmarking, profile calibrate() for METHOD at the "
        "smallest N (py-spy or cProfile) and print where its time goes",
    )
    p.add_argument(
        "--profiler",
        choices=("auto", "py-spy", "cprofile"),
        default="auto",
        help="for --profile: py-spy when installed (line-level), else cProfile",
    )
    p.add_argument(
        "--profile-out",
        type=Path,
        help="keep the raw profile (py-spy raw stacks or cProfile stats) here",
    )
    p.add_argument("--top", type=int, default=20, help="functions listed by --profile")
    args = p.parse_args(argv)
    if args.table:
        results = json.loads(args.table.read_text())
        rows, targets = table(results)
        print("\n".join(rows) + "\n\ntargets:\n" + "\n".join(targets))
        return 0
    if args.calib is None:
        args.calib = Path("~/zw/calib").expanduser() / args.model.stem
    if not args.model.is_file():
        p.error(f"model not found: {args.model}")
    if not args.calib.is_dir():
        p.error(f"calibration folder not found: {args.calib}")
    args.model, args.calib = args.model.resolve(), args.calib.resolve()
    if args.profile:
        profile(args)
        return 0
    results = bench(args)
    rows, targets = table(results)
    results["table"], results["targets"] = rows, targets
    print()
    print("\n".join(rows))
    print()
    print("targets:")
    print("\n".join(targets))
    m = results["machine"]
    print(
        f"\nmachine: {m['nproc']} x {m['cpu']}, onnxruntime {m['onnxruntime']}, "
        f"load {m['loadavg_start']} -> {m['loadavg_end']}; histogram counting: "
        f"{m.get('histogram_counting', '?')}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
