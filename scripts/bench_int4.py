"""Benchmark weight-only INT4 quantization of a causal LM: onnxq against its peers.

Usage::

    python scripts/bench_int4.py [--model smollm2_135m.onnx] [--calib DIR] [--eval-ids IDS.npy]
        [--methods onnxq-128,onnxq-32,onnxq-trt-128,ort-rtn-128,...] [--windows 64]
        [--modelopt-python PY] [--workdir DIR] [--latency-runs 15] [--no-latency]

Each method quantizes the float model in a child process (wall time, and peak RSS from
``os.wait4`` and ``/proc`` polling of its process group); then, in this process, every output
and the float model are evaluated the same way (the TensorRT-format outputs, onnxq-trt and
ModelOpt, with float activations as TensorRT computes them; onnxruntime would otherwise
quantize them to int8 inside its fused kernel): perplexity over ``--windows`` windows of the
evaluation ids (``zoo.py eval``'s measure: every token after the first predicted), top-1
next-token accuracy, file size (model + external data), and onnxruntime CPU latency at batch 1,
sequence length 1 and 128, one thread, median of ``--latency-runs`` runs, measured interleaved
(float, method, float, method, ...) so that a busy machine slows all alike.

Methods (``--methods``, comma-separated; ``-B`` is the block size):

* ``onnxq-B``: ``onnxq quantize --weights int4 --backend onnxruntime --block-size B --calib``
  (MatMulNBits; the defaults: GPTQ, head at 8 bits);  ``onnxq-trt-B``: the same for
  ``--backend tensorrt`` (blocked int4 DequantizeLinear, run here by onnxruntime);
  ``onnxq-acc0-B``: MatMulNBits with ``weight_accuracy_level: 0`` (float compute);
  ``onnxq-rtn-B``: ``--algorithm rtn`` without calibration data.
* ``ort-rtn-B`` / ``ort-rtn-asym-B``: onnxruntime's ``MatMulNBitsQuantizer``, default
  (round-to-nearest) algorithm, symmetric / asymmetric; ``ort-hqq-B``: its HQQ (asymmetric).
  All MatMuls with a constant weight, the LM head included.
* ``modelopt-awq-128`` / ``modelopt-rtn-128``: ``python -m modelopt.onnx.quantization
  --quantize_mode int4 --calibration_method awq_clip|rtn_dq --high_precision_dtype fp32``
  run with ``--modelopt-python`` (a python with ``nvidia-modelopt[onnx]``, which pins its own
  onnx/onnxruntime), on CPU, given a copy of the model (it saves shape inference over its
  input file); its command line takes no block size (128).

Peers take their own defaults, as a user would.  Prints a markdown table; ``--json`` writes the
records.  Say which CPU and onnxruntime version: the script prints both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from lm_perplexity import window_scores  # scripts/, beside this file
from zoo_paths import CALIB, MODELS, ZOO

DEFAULT_METHODS = (
    "onnxq-128,onnxq-32,onnxq-trt-128,ort-rtn-128,ort-rtn-32,"
    "ort-rtn-asym-128,ort-hqq-128,ort-hqq-32"
)

# outputs whose perplexity is measured with float activations (what TensorRT computes)
FLOAT_DQ = ("onnxq-trt", "modelopt")

ORT_CHILD = """
import sys
from onnxruntime.quantization import matmul_nbits_quantizer as q
src, out, algo = sys.argv[1:4]
block, sym = int(sys.argv[4]), sys.argv[5] == "1"
if algo == "hqq":
    config = q.HQQWeightOnlyQuantConfig(block_size=block, bits=4)
else:
    config = q.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=sym)
quantizer = q.MatMulNBitsQuantizer(src, block_size=block, is_symmetric=sym, algo_config=config)
quantizer.process()
quantizer.model.save_model_to_file(out, use_external_data_format=False)
"""


def run_child(cmd: list[str], log: Path, timeout_s: float) -> dict[str, object]:
    """Run ``cmd`` in its own process group: wall time, exit status, peak RSS (MiB)."""
    start, peak = time.time(), 0.0
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _group_rss_mib(proc.pid))
            if time.time() - start > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    code = os.waitstatus_to_exitcode(status)
    return {
        "status": "ok"
        if code == 0
        else ("timeout" if time.time() - start > timeout_s else "error"),
        "seconds": round(time.time() - start, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mib": round(max(usage.ru_maxrss / 1024, peak)),
    }


def _group_rss_mib(pgid: int) -> float:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{entry}/status") as fh:
                total += next(int(x.split()[1]) for x in fh if x.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    return total / 1024


def command(method: str, args: argparse.Namespace, out: Path) -> list[str] | str:
    """The child command of a method, or why it cannot run here."""
    *kind, block = method.split("-")
    name = "-".join(kind)
    model = str(args.model)
    onnxq = [sys.executable, "-m", "onnxq.cli", "quantize", model, "-o", str(out), "-q"]
    if name in ("onnxq", "onnxq-trt", "onnxq-acc0"):
        backend = "tensorrt" if name == "onnxq-trt" else "onnxruntime"
        flags = ["--weights", "int4", "--backend", backend, "--block-size", block]
        if name == "onnxq-acc0":  # MatMulNBits computing in float (accuracy_level 0)
            config = out.with_suffix(".yaml")
            config.write_text("weight_accuracy_level: 0\n")
            flags += ["--config", str(config)]
        return [*onnxq, *flags, "--calib", str(args.calib)]
    if name == "onnxq-rtn":
        flags = ["--weights", "int4", "--backend", "onnxruntime", "--block-size", block]
        return [*onnxq, *flags, "--algorithm", "rtn"]
    if name in ("ort-rtn", "ort-rtn-asym", "ort-hqq"):
        algo = "hqq" if name == "ort-hqq" else "default"
        sym = "1" if name == "ort-rtn" else "0"
        return [sys.executable, "-c", ORT_CHILD, model, str(out), algo, block, sym]
    if name in ("modelopt-awq", "modelopt-rtn"):
        if not args.modelopt_python:
            return "needs --modelopt-python (a python with nvidia-modelopt[onnx])"
        if block != "128":
            return "ModelOpt's command line has no block size option (it uses 128)"
        calib = out.with_suffix(".calib.npz")
        _modelopt_calibration(args.calib, calib, args.modelopt_windows)
        method_name = "awq_clip" if name == "modelopt-awq" else "rtn_dq"
        return [
            args.modelopt_python,
            "-m",
            "modelopt.onnx.quantization",
            "--onnx_path",
            str(_private_copy(args.model, out.with_suffix(".input.onnx"))),
            "--quantize_mode",
            "int4",
            "--calibration_method",
            method_name,
            "--calibration_data_path",
            str(calib),
            "--calibration_eps",
            "cpu",
            "--high_precision_dtype",
            "fp32",
            "--output_path",
            str(out),
        ]
    return f"unknown method {method!r}"


def _private_copy(model: Path, copy: Path) -> Path:
    """A copy of ``model`` for a tool that rewrites its input: ModelOpt 0.47 runs
    ``onnx.shape_inference.infer_shapes_path(onnx_path)``, which saves the inferred model over
    the file it was given (the zoo's model would change under every other user)."""
    shutil.copyfile(model, copy)
    return copy


def _modelopt_calibration(folder: Path, out: Path, windows: int) -> None:
    """ModelOpt's CLI takes one npz of all calibration batches concatenated on axis 0."""
    files = sorted(folder.glob("*.npz"))[:windows]
    batches = [dict(np.load(f)) for f in files]
    np.savez(out, **{k: np.concatenate([b[k] for b in batches]) for k in batches[0]})


def perplexity(path: Path, ids: np.ndarray, float_dq: bool = False) -> tuple[float, float]:
    """Perplexity and top-1 next-token accuracy over the windows ``ids`` ([windows, tokens]).

    ``float_dq``: keep onnxruntime's fusion of a blocked DequantizeLinear -> MatMul into
    MatMulNBits computing in float (accuracy level 0), what TensorRT computes; by default it
    quantizes the activations to int8 there (level 4)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if float_dq:
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    nll, hits, count = window_scores(session, ids)
    return math.exp(nll / count), hits / count


def latency(paths: dict[str, Path], runs: int) -> dict[str, dict[int, float]]:
    """Median ms at sequence length 1 and 128, batch 1, one thread, interleaved."""
    import onnxruntime as ort

    def session(p: Path) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        return ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])

    sessions = {name: session(p) for name, p in paths.items()}
    rng = np.random.default_rng(0)
    out: dict[str, dict[int, float]] = {name: {} for name in paths}
    for seq in (1, 128):
        ids = rng.integers(0, 96, size=(1, seq)).astype(np.int64)  # ids every vocabulary has
        feeds = {
            name: {
                i.name: (ids if i.name == "input_ids" else np.ones_like(ids))
                for i in s.get_inputs()
            }
            for name, s in sessions.items()
        }
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for name, s in sessions.items():
            s.run(None, feeds[name])  # warm up
        for _ in range(runs):
            for name, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds[name])
                times[name].append(time.perf_counter() - t)
        for name in sessions:
            out[name][seq] = statistics.median(times[name]) * 1000
    return out


def file_mib(path: Path) -> float:
    """Model file plus the external data files next to it written by the same run."""
    extra = [p for p in path.parent.glob(path.name + "*") if p != path]
    extra += [p for p in path.parent.glob(path.stem + ".data")]
    return (path.stat().st_size + sum(p.stat().st_size for p in set(extra))) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=MODELS / "smollm2_135m.onnx")
    p.add_argument("--calib", type=Path, default=CALIB / "smollm2_135m")
    p.add_argument("--eval-ids", type=Path, default=ZOO / "data" / "lm" / "eval_ids.npy")
    p.add_argument("--methods", default=DEFAULT_METHODS)
    p.add_argument("--windows", type=int, default=64, help="evaluation windows (zoo: 64)")
    p.add_argument("--modelopt-python", default=os.environ.get("ZOO_MODELOPT_PYTHON"))
    p.add_argument(
        "--modelopt-windows", type=int, default=32, help="calibration windows for ModelOpt"
    )
    p.add_argument("--workdir", type=Path, help="outputs and per-method records (kept)")
    p.add_argument(
        "--reuse", action="store_true", help="keep a method's earlier record in --workdir"
    )
    p.add_argument("--no-float-eval", action="store_true", help="skip the float perplexity")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--latency-runs", type=int, default=15)
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import onnxruntime as ort

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-int4-"))
    work.mkdir(parents=True, exist_ok=True)
    ids = np.load(args.eval_ids)[: args.windows]
    print(
        f"CPU: {_cpu()}; onnxruntime {ort.__version__}; {os.cpu_count()} cores; "
        f"python {platform.python_version()}; {len(ids)} evaluation windows",
        flush=True,
    )
    base: dict[str, object] = {"method": "float", "path": str(args.model), "status": "ok"}
    if not args.no_float_eval:
        base["ppl"], base["top1"] = perplexity(args.model, ids)
    base["file_mib"] = round(file_mib(args.model), 1)
    records = [base]
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        records.append(run_method(method, args, work, ids))
    done = [r for r in records if r["status"] == "ok"]
    if not args.no_latency:
        lat = latency({str(r["method"]): Path(str(r["path"])) for r in done}, args.latency_runs)
        for r in done:
            r["ms_seq1"], r["ms_seq128"] = lat[str(r["method"])][1], lat[str(r["method"])][128]
    print_table(records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0


def run_method(
    method: str, args: argparse.Namespace, work: Path, ids: np.ndarray
) -> dict[str, object]:
    """Quantize with ``method`` and evaluate its output; the record is also written to
    ``work/METHOD.json`` (``--reuse`` takes it from there)."""
    out, saved = work / f"{method}.onnx", work / f"{method}.json"
    if args.reuse and saved.exists() and out.exists():
        return dict(json.loads(saved.read_text()))
    cmd = command(method, args, out)
    if isinstance(cmd, str):
        return {"method": method, "status": "skipped", "why": cmd}
    print(f"quantizing: {method}: {' '.join(shlex.quote(c) for c in cmd[:8])} ...", flush=True)
    rec: dict[str, object] = {"method": method, "path": str(out)}
    rec.update(run_child(cmd, work / f"{method}.log", args.timeout))
    if rec["status"] == "ok" and not out.exists():
        rec["status"] = "error"
    if rec["status"] == "ok":
        rec["ppl"], rec["top1"] = perplexity(out, ids, float_dq=method.startswith(FLOAT_DQ))
        rec["file_mib"] = round(file_mib(out), 1)
        print(f"evaluated: {method}: perplexity {rec['ppl']:.3f} ({rec})", flush=True)
    saved.write_text(json.dumps(rec, indent=1))
    return rec


def print_table(records: list[dict[str, object]]) -> None:
    """The markdown table: one row per method, latency also as a ratio to float."""
    base = next(r for r in records if r["method"] == "float")
    print(
        "\n| method | perplexity | top-1 | file MiB | quantize s (CPU s) | peak RSS MiB "
        "| ms seq 1 (x float) | ms seq 128 (x float) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        if r["status"] != "ok":
            print(f"| {r['method']} | {r['status']}: {r.get('why', 'see its .log')} | | | | | | |")
            continue
        seq1, seq128 = _ms(r, base, "ms_seq1"), _ms(r, base, "ms_seq128")
        ppl = f"{r['ppl']:.3f} | {r['top1']:.3f}" if "ppl" in r else "- | -"
        print(
            f"| {r['method']} | {ppl} | {r['file_mib']} | "
            f"{r.get('seconds', '-')} ({r.get('cpu_seconds', '-')}) | {r.get('peak_rss_mib', '-')} "
            f"| {seq1} | {seq128} |"
        )


def _ms(record: dict[str, object], base: dict[str, object], key: str) -> str:
    if key not in record:
        return "-"
    value, ref = float(record[key]), float(base[key])  # type: ignore[arg-type]
    return f"{value:.3g} ({value / ref:.2f})"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
