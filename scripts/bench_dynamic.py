#!/usr/bin/env python3
"""onnxq `--dynamic` against onnxruntime's `quantize_dynamic`: fidelity and latency side by side.

    python scripts/bench_dynamic.py [--models all_minilm_l6_v2,silero_vad,gru_kws,crnn_kws,
        lstm_kws,smollm2_135m] [--zoo ZOO_DIR] [--recurrent DIR] [--out DIR]
        [--rounds 9] [--threads 1] [--clock cpu] [--processes 1] [--no-huge-pages]
        [--lm-windows N]
        [--extra LABEL=DIR ...]

For each model it writes three files under ``--out`` (default: a temporary folder): the float
model, onnxq's ``--dynamic`` output, and onnxruntime's ``quantize_dynamic`` output with its
defaults (per-tensor weights, the peer the issue names; for silero_vad also with
``EnableSubgraph``, which quantizes the LSTM inside its ``If`` branches).  Then:

* fidelity: zoo models through ``zoo.py eval`` (its labelled score and its cosine against the
  float model; smollm2_135m: perplexity over the 64 windows, takes minutes, or over the first
  ``--lm-windows`` of them, computed here the same way); the recurrent keyword spotters of
  ``scripts/make_gru_kws.py`` (built into ``--recurrent`` when missing) on their 512 held-out
  utterances: logits cosine, top-1 agreement with float, accuracy;
* latency: all variants of one model timed in turns in one fresh process (onnxruntime default
  session, ``--threads`` threads, the zoo's first calibration batch or 8 eval utterances as
  input; a language model also with its first token alone, as one step of generation),
  ``--rounds`` rounds, the order reversed every other round; each variant's median time, and
  its time over float's and over onnxruntime's ``quantize_dynamic`` output's, each the median
  of the ratios within one round (both sides of a ratio see the same load).  ``--clock cpu``
  (the default with one thread) times the CPU time of the thread that runs the session, which
  other jobs on a shared machine do not inflate as they do wall time; ``--clock wall`` times
  wall time.  ``--processes N`` repeats each model's timing in N fresh processes, one after
  another, the k-th making and timing the variants in their order rotated by k, and takes
  the median of their ratios (each process's shown): where a session's weights land in memory
  moves a memory-bound run by a few percent from one process, or one creation order, to the
  next (smollm2_135m's one-token step against ``quantize_dynamic``'s: 0.91x to 1.08x in
  separate processes timing the same two files).  The timing processes ask glibc for
  transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, where the kernel offers
  them), which takes most of that spread away (1.00x to 1.05x over 6 processes);
  ``--no-huge-pages`` leaves memory as a plain process gets it.

The header names the CPU, onnxruntime version and clock; a machine shared with other jobs shows
up as spread between rounds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from lm_perplexity import window_scores  # scripts/, beside this file
from zoo_paths import CACHE, MODELS, ZOO, calibration_folder

RECURRENT = ("gru_kws", "crnn_kws", "lstm_kws")
# glibc.malloc.hugetlb=1: malloc asks for transparent huge pages (madvise); glibc >= 2.35
THP = 1
PEER = "ort quantize_dynamic"  # the variant the "no slower" compares with
DEFAULT = ("all_minilm_l6_v2", "silero_vad", *RECURRENT, "smollm2_135m")
# the zoo metric that measures each model's fidelity to float (besides its score)
ZOO_FIDELITY = {
    "all_minilm_l6_v2": "sentence_embedding_cos",
    "silero_vad": "prob_cos",
    "smollm2_135m": "ppl",
}


def build_variants(name: str, src: Path, out: Path) -> dict[str, Path]:
    """float / onnxq --dynamic / onnxruntime quantize_dynamic (and its subgraph variant)."""
    from onnxruntime.quantization import quantize_dynamic

    import onnxq

    paths = {"float": src}
    started = time.perf_counter()
    result = onnxq.quantize(src, backend="onnxruntime", dynamic=True, progress=False)
    (out / "onnxq").mkdir(parents=True, exist_ok=True)
    result.save(out / "onnxq" / f"{name}.onnx")
    paths["onnxq --dynamic"] = out / "onnxq" / f"{name}.onnx"
    print(
        f"  onnxq --dynamic: {len(result.report.quantized_ops)} ops quantized in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    peers: dict[str, dict] = {PEER: {}}
    if name == "silero_vad":
        peers["ort quantize_dynamic (EnableSubgraph)"] = {"extra_options": {"EnableSubgraph": True}}
    for label, options in peers.items():
        folder = out / label.replace(" ", "_").replace("(", "").replace(")", "")
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        try:
            quantize_dynamic(src, folder / f"{name}.onnx", **options)
        except Exception as exc:  # the peer's own failure: say it, compare the rest
            print(f"  {label}: fails: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        paths[label] = folder / f"{name}.onnx"
        print(f"  {label}: {time.perf_counter() - started:.1f} s", flush=True)
    return paths


def lm_perplexity(path: Path, zoo: Path, windows: int) -> dict[str, float]:
    """Perplexity and next-token accuracy over the first ``windows`` evaluation windows, as
    ``zoo.py eval`` computes them over all 64."""
    ids = np.load(zoo / "data" / "lm" / "eval_ids.npy")[:windows]
    session = _session(path, 0)
    nll_sum, hits, count = window_scores(session, ids)
    return {"perplexity": float(np.exp(nll_sum / count)), "top1": hits / count}


def zoo_fidelity(name: str, path: Path, zoo: Path) -> dict[str, float]:
    """``zoo.py eval`` of one file: its score and the fidelity metric of :data:`ZOO_FIDELITY`."""
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / f"{name}.onnx"
        link.symlink_to(path.resolve())
        report = Path(tmp) / "eval.json"
        subprocess.run(
            [sys.executable, "zoo.py", "eval", "--models", tmp, "--ref", str(MODELS),
             "--only", name, "--json", str(report)],
            cwd=zoo, check=True, capture_output=True,
        )  # fmt: skip
        record = json.loads(report.read_text())[name]
    if "error" in record:
        return {"error": record["error"]}
    metrics = {"score": record["score"]}
    key = ZOO_FIDELITY[name]
    if key == "ppl":
        metrics["perplexity"] = record["metrics"]["ppl"]
    else:
        metrics["cosine"] = record["fidelity"][key]
    return metrics


def kws_fidelity(paths: dict[str, Path], data: Path) -> dict[str, dict[str, float]]:
    """Logits cosine and top-1 agreement with float, and accuracy, on the held-out utterances."""
    with np.load(data / "eval.npz") as z:
        features, labels = z["features"], z["labels"]
    ref = _session(paths["float"], 0).run(None, {"features": features})[0]
    out = {}
    for label, path in paths.items():
        logits = _session(path, 0).run(None, {"features": features})[0]
        cos = float((ref * logits).sum() / (np.linalg.norm(ref) * np.linalg.norm(logits)))
        out[label] = {
            "cosine": cos,
            "top1_agreement": float((logits.argmax(1) == ref.argmax(1)).mean()),
            "accuracy": float((logits.argmax(1) == labels).mean()),
        }
    return out


def _session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def latency(
    paths: dict[str, Path], feed: dict, rounds: int, threads: int, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Each variant's ms per run in each round, timed in turns by ``clock``, ``rounds`` rounds
    (the order reversed every other round)."""
    sessions = {label: _session(path, threads) for label, path in paths.items()}
    for s in sessions.values():
        s.run(None, feed)
    once = clock()
    sessions["float"].run(None, feed)
    runs = max(3, min(50, int(1.0 / max(clock() - once, 1e-4))))
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for round_ in range(rounds):
        order = list(sessions.items())
        for label, s in order[::-1] if round_ % 2 else order:
            started = clock()
            for _ in range(runs):
                s.run(None, feed)
            times[label].append((clock() - started) / runs * 1e3)
    return times


def latency_runs(
    paths: dict[str, Path],
    feed: dict,
    rounds: int,
    threads: int,
    clock: Callable[[], float],
    processes: int,
) -> list[dict[str, list[float]]]:
    """:func:`latency` once in each of ``processes`` fresh processes, one after another, the
    k-th creating (and timing) the variants in their order rotated by k: where a session's
    weights land depends on when it is made."""
    runs = []
    labels = list(paths)
    for k in range(max(processes, 1)):
        turn = labels[k % len(labels) :] + labels[: k % len(labels)]
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rotated = {label: paths[label] for label in turn}
            runs.append(pool.apply(latency, (rotated, feed, rounds, threads, clock)))
    return runs


def paired_ratio(times: dict[str, list[float]], label: str, peer: str) -> float:
    """The median over rounds of ``label``'s time over ``peer``'s in the same round: a load
    that slows one round slows both sides of its ratio."""
    return statistics.median(a / b for a, b in zip(times[label], times[peer], strict=True))


def first_feed(name: str, recurrent: Path) -> dict:
    if name in RECURRENT:
        with np.load(recurrent / "eval.npz") as z:
            return {"features": z["features"][:8]}
    with np.load(sorted(calibration_folder(name).glob("*.npz"))[0]) as z:
        return {k: z[k] for k in z.files}


def use_huge_pages() -> str:
    """Ask glibc to back the processes started from now on (the timing processes) with
    transparent huge pages: the weights then sit in 2 MiB pages wherever they land, which
    removes most of the spread between processes of a memory-bound run (smollm2_135m's one-token
    step, 6 processes: 0.91-1.08x without, 1.00-1.05x with).  Returns what the header says."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "huge pages: not available here (no transparent huge pages)"
    os.environ["GLIBC_TUNABLES"] = ":".join(
        t for t in (os.environ.get("GLIBC_TUNABLES", ""), f"glibc.malloc.hugetlb={THP}") if t
    )
    return f"huge pages: glibc.malloc.hugetlb={THP} (transparent huge pages: {mode})"


def describe_cpu() -> str:
    from onnxq.backends.cpu import this_machine

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    target = this_machine()  # what onnxq tunes the onnxruntime output for (7-bit weights, ...)
    return f"{name}, CPU class {target.name} ({target.source}); onnxruntime {ort.__version__}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT))
    p.add_argument("--zoo", type=Path, default=ZOO)
    p.add_argument("--recurrent", type=Path, default=CACHE / "recurrent")
    p.add_argument("--out", type=Path)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="time each model in this many fresh processes, one after another (the median "
        "of their ratios; default 1)",
    )
    p.add_argument(
        "--huge-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="back the timing processes' memory with transparent huge pages (default; "
        "--no-huge-pages: as a plain process gets it)",
    )
    p.add_argument("--lm-windows", type=int, default=0, help="0: all 64, through zoo.py eval")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also measure DIR/<model>.onnx as variant LABEL (e.g. onnxq at another commit)",
    )
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_dynamic_"))
    cpu_clock = args.clock == "cpu" and args.threads == 1  # one thread: the session runs here
    clock = time.thread_time if cpu_clock else time.perf_counter
    pages = use_huge_pages() if args.huge_pages else "huge pages: off"
    print(
        f"# {describe_cpu()}; {args.threads} thread(s); "
        f"{'thread CPU' if cpu_clock else 'wall'} time; {pages}; outputs in {out}"
    )
    names = args.models.split(",")
    wanted = [args.recurrent / f"{n}.onnx" for n in names if n in RECURRENT]
    if wanted and not all(p.exists() for p in [*wanted, args.recurrent / "eval.npz"]):
        sys.path.insert(0, str(Path(__file__).parent))
        from make_gru_kws import main as make_recurrent

        make_recurrent(args.recurrent)
    rows = []
    for name in names:
        src = (args.recurrent if name in RECURRENT else MODELS) / f"{name}.onnx"
        print(f"{name}:", flush=True)
        paths = build_variants(name, src, out)
        for label, folder in (extra.split("=", 1) for extra in args.extra):
            if (Path(folder) / f"{name}.onnx").exists():
                paths[label] = Path(folder) / f"{name}.onnx"
        fidelity = measure_fidelity(name, paths, args)
        for label in paths:
            fidelity[label]["kernels"] = integer_kernels(paths[label]) if label != "float" else "-"
        feeds = {name: first_feed(name, args.recurrent)}
        if ZOO_FIDELITY.get(name) == "ppl":  # one generation step too
            feeds[f"{name} (1 token)"] = {k: v[:, :1] for k, v in feeds[name].items()}
        for shown, feed in feeds.items():
            runs = latency_runs(paths, feed, args.rounds, args.threads, clock, args.processes)
            for label in paths:
                ms = statistics.median(t for times in runs for t in times[label])
                to_float = statistics.median(paired_ratio(t, label, "float") for t in runs)
                each = [paired_ratio(t, label, PEER) for t in runs if PEER in t]
                to_peer = statistics.median(each) if each else float("nan")
                shown_each = f" [{', '.join(f'{r:.3f}' for r in each)}]" if len(each) > 1 else ""
                rows.append((shown, label, fidelity[label], ms, to_float, to_peer))
                ratios = f"{to_float:.3f}x float, {to_peer:.3f}x {PEER}{shown_each}"
                print(f"  {shown}: {label:40s} {_fmt(fidelity[label])}  {ms:9.2f} ms ({ratios})",
                      flush=True)  # fmt: skip
    print(f"\n| model | variant | fidelity | ms | x float | x {PEER} |\n|---|---|---|---|---|---|")
    for name, label, fid, ms, to_float, to_peer in rows:
        print(f"| {name} | {label} | {_fmt(fid)} | {ms:.2f} | {to_float:.3f} | {to_peer:.3f} |")


def measure_fidelity(
    name: str, paths: dict[str, Path], args: argparse.Namespace
) -> dict[str, dict]:
    """Each variant's fidelity: the keyword spotters' held-out set, a language model's
    perplexity (over ``--lm-windows`` windows when given), else ``zoo.py eval``."""
    if name in RECURRENT:
        return kws_fidelity(paths, args.recurrent)
    if ZOO_FIDELITY.get(name) == "ppl" and args.lm_windows:
        return {label: lm_perplexity(p, args.zoo, args.lm_windows) for label, p in paths.items()}
    return {label: zoo_fidelity(name, path, args.zoo) for label, path in paths.items()}


def _fmt(metrics: dict) -> str:
    digits = {"cosine": 6, "perplexity": 2, "top1": 4}
    return ", ".join(
        f"{k} {v:.{digits.get(k, 4)}f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in metrics.items()
    )


def integer_kernels(path: Path) -> str:
    """The integer / dynamic kernels in a model (subgraphs included): what each tool quantized."""
    counts: dict[str, int] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type in KERNELS:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    walk(sub)

    walk(onnx.load(str(path), load_external_data=False).graph)
    return " ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"


KERNELS = frozenset(
    {
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "MatMulInteger",
        "DynamicQuantizeLSTM",
        "ConvInteger",
        "DequantizeLinear",
    }
)


if __name__ == "__main__":
    main()
