"""Write docs/results.md: onnxq's current results, with the machine and versions behind them.

Usage::

    python scripts/results_page.py [-o docs/results.md] [--no-example]
        [--zoo-float EVAL_FLOAT.json] [--zoo BACKEND=EVAL.json ...] [--zoo-log LOG.txt]
        [--peers PEERS.md] [--section "TITLE=EVAL.json" ...]

What it measures itself, in this run: the bundled digits example (quantized for both backends;
file size, latency and accuracy by ``examples/digits/evaluate.py``).  What it reads: the zoo
evaluations that ``zoo.py eval --json`` wrote (``--zoo``, and the float model's with
``--zoo-float``), quantization times from a log of lines ``MODEL BACKEND SECONDS s KB KB``
(``--zoo-log``), the peer quantizers' table (``--peers``, a markdown file with
``## score_unfused`` and ``## score`` tables), and any more evaluations as sections (INT4,
precisions, recovery, mixed precision: ``--section "TITLE=EVAL.json"``).  A known section whose
input is not given says "not measured in this run"; no figure is ever made up.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits"
# the sections every page has, each with the docs page that holds the feature's own measurements
KNOWN_SECTIONS = {
    "INT4 weight-only": "weight-only.md",
    "Other precisions (FP8, INT16, dynamic)": "precisions.md",
    "Accuracy recovery (CLE, AdaRound, SmoothQuant)": "recovery.md",
    "Mixed precision": "mixed_precision.md",
}
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp")
NOT_MEASURED = "Not measured in this run."


def machine() -> list[str]:
    """Lines that say which machine and software produced the figures measured here."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        text = cpuinfo.read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        model = found.group(1).strip() if found else model
        for line in text.splitlines():
            if line.startswith(("flags", "Features")):
                flags |= set(line.split(":", 1)[1].split())
    import onnxq

    commit = _git("rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain") else ""
    return [
        f"- CPU: {model}, {_cores()} cores; flags: "
        + (", ".join(f for f in CPU_FLAGS if f in flags) or "none of " + ", ".join(CPU_FLAGS)),
        f"- Python {platform.python_version()}, onnxruntime {ort.__version__}, onnx "
        f"{onnx.__version__}, numpy {np.__version__}",
        f"- onnxq {onnxq.__version__}, commit {commit or 'unknown'}{dirty}",
        f"- date: {datetime.date.today().isoformat()}",
    ]


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def example_section() -> list[str]:
    """Quantize the bundled example for both backends and compare each with the float model."""
    spec = importlib.util.spec_from_file_location("digits_evaluate", EXAMPLE / "evaluate.py")
    assert spec is not None and spec.loader is not None
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    lines = [
        "## The bundled example",
        "",
        "`examples/digits/digits_cnn.onnx` quantized with default settings, compared by "
        "`examples/digits/evaluate.py` (latency: one image, one thread, float and INT8 in "
        "turns, median of 200 runs; INT8 accuracy and agreement in onnxruntime's default "
        "session). The `tensorrt` output is laid out for TensorRT; in onnxruntime's CPU "
        "session its float ops run behind DequantizeLinear nodes, so there it can be slower "
        "than float: deploy on CPU with `--backend onnxruntime`.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("onnxruntime", "tensorrt"):
            out = Path(tmp) / f"{backend}.onnx"
            subprocess.run(
                [sys.executable, "-m", "onnxq.cli", "quantize", str(EXAMPLE / "digits_cnn.onnx"),
                 "-o", str(out), "--calib", str(EXAMPLE / "calib"), "--backend", backend, "-q"],
                check=True, cwd=ROOT,
            )  # fmt: skip
            rows = evaluate.comparison(evaluate.parse_args([str(out)]))
            lines += [f"`--backend {backend}`:", "", "| | float | INT8 | |", "|---|---|---|---|"]
            lines += [f"| {' | '.join(row)} |" for row in rows]
            lines.append("")
    return lines


def load_eval(path: Path) -> dict[str, dict[str, Any]]:
    """A ``zoo.py eval --json`` file: model -> its figures (or ``{"error": ...}``)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a zoo.py eval file (expected a JSON object)")
    return data


def _score(entry: dict[str, Any] | None, key: str) -> str:
    if entry is None:
        return "-"
    if "error" in entry:
        return "not run" if str(entry["error"]).startswith("missing") else "ERROR"
    value = entry.get(key)
    return "-" if value is None else f"{value:.3f}"


def zoo_section(
    float_eval: Path | None, evals: dict[str, Path], log: Path | None, note: str
) -> list[str]:
    """onnxq's scores on the zoo per backend, fused and unfused, and its quantization time."""
    lines = ["## The zoo", ""]
    if not evals:
        return [*lines, NOT_MEASURED, ""]
    runs = {name: load_eval(path) for name, path in evals.items()}
    ref = load_eval(float_eval) if float_eval else {}
    times = _times(log) if log else {}
    lines += [
        "Read from " + ", ".join(f"`{p.name}` ({n})" for n, p in evals.items()) + ". `score`: "
        "onnxruntime's default session (Q/DQ fused into int8 kernels: depends on the CPU "
        "class of the machine that ran `zoo.py eval`); `unfused`: the Q/DQ graph's own "
        "arithmetic (what TensorRT computes; the same on every machine)."
        + (f" {note}" if note else ""),
        "",
    ]
    header = ["model", "float"]
    for name in runs:
        header += [f"{name} score", f"{name} unfused"] + ([f"{name} time"] if times else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    models = [m for m in dict.fromkeys(m for r in runs.values() for m in r)]
    for model in models:
        cells = [model, _score(ref.get(model), "score")]
        for name, run in runs.items():
            cells += [_score(run.get(model), "score"), _score(run.get(model), "score_unfused")]
            if times:
                cells.append(times.get((model, name), "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _times(log: Path) -> dict[tuple[str, str], str]:
    found = re.findall(r"^(\S+) (\S+) ([0-9.]+) s ([0-9]+) KB$", log.read_text(), re.MULTILINE)
    return {(m, b): f"{float(s):.0f} s / {int(kb) // 1024} MB" for m, b, s, kb in found}


def peers_section(peers: Path | None) -> list[str]:
    """The peer quantizers' tables, as measured and described in ``peers``."""
    lines = ["## Other quantizers", ""]
    if peers is None:
        return [*lines, NOT_MEASURED, ""]
    text = peers.read_text()
    intro = text.split("\n## ", 1)[0].splitlines()[1:]
    lines += [
        f"From `{peers.name}`, measured separately with the same calibration batches; its "
        "setup, as it states it:",
        "",
    ]
    lines += ["> " + ln if ln.strip() else ">" for ln in intro if ln.strip()]
    for block in text.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        lines += ["", f"### {title.strip()}", "", body.strip()]
    return [*lines, ""]


def side_by_side(evals: dict[str, Path], peers: Path | None) -> list[str]:
    """onnxq's unfused scores next to the peers' (the figure that is the same on every CPU)."""
    if not evals or peers is None:
        return []
    tables = dict(_markdown_tables(peers.read_text()))
    peer = next((t for title, t in tables.items() if title.startswith("score_unfused")), None)
    if not peer:
        return []
    header, rows = peer[0], {r[0]: r for r in peer[1:]}
    runs = {name: load_eval(path) for name, path in evals.items()}
    cols = ["model", header[1], *(f"**onnxq {n}**" for n in runs), *header[2:]]
    lines = [
        "### Side by side: score_unfused",
        "",
        "onnxq's columns from the zoo evaluations above, the others from the peers' table.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for model, row in rows.items():
        ours = [_score(r.get(model), "score_unfused") for r in runs.values()]
        lines.append("| " + " | ".join([model, row[1], *ours, *row[2:]]) + " |")
    return [*lines, ""]


def _markdown_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """(section title, rows of cells) of each ``## `` section's first table."""
    out = []
    for block in text.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        rows = [
            [c.strip() for c in ln.strip().strip("|").split("|")]
            for ln in body.splitlines()
            if ln.startswith("|") and not set(ln) <= set("|-: ")
        ]
        if rows:
            out.append((title.strip(), rows))
    return out


def extra_section(title: str, path: Path | None) -> list[str]:
    """One more evaluation (INT4, precisions, ...): its scores, or that it was not measured."""
    lines = [f"## {title}", ""]
    if path is None:
        page = KNOWN_SECTIONS.get(title)
        where = f" [{page}]({page}) has the figures its own script measured." if page else ""
        return [*lines, NOT_MEASURED + where, ""]
    run = load_eval(path)
    lines += [
        f"Read from `{path.name}`.",
        "",
        "| model | float | score | unfused | fidelity to float (unfused) |",
        "|---|---|---|---|---|",
    ]
    for model, entry in run.items():
        lines.append(
            f"| {model} | {_score(entry, 'ref_score')} | {_score(entry, 'score')} | "
            f"{_score(entry, 'score_unfused')} | {_fidelity(entry)} |"
        )
    return [*lines, ""]


def _fidelity(entry: dict[str, Any]) -> str:
    """An evaluation's ``fidelity_unfused`` in short: each output's cosine and agreement
    (``logits cos 0.9968, logits top-1 0.9464``), or ``-``."""
    parts = []
    for key, value in (entry.get("fidelity_unfused") or {}).items():
        if key.endswith("_top1_agreement"):
            parts.append(f"{key.removesuffix('_top1_agreement')} top-1 {value:.4f}")
        elif key.endswith("_agreement"):
            parts.append(f"{key.removesuffix('_agreement')} agreement {value:.4f}")
        elif key.endswith("_cos"):
            parts.append(f"{key.removesuffix('_cos')} cos {value:.4f}")
    return ", ".join(parts) or "-"


def _pairs(values: list[str], what: str) -> dict[str, Path]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"{what} {value!r}: give NAME=PATH of an existing file")
        out[name] = Path(path)
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the page."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", type=Path, default=ROOT / "docs" / "results.md")
    p.add_argument("--no-example", action="store_true", help="skip the bundled example")
    p.add_argument("--zoo-float", type=Path, help="zoo.py eval --json of the float models")
    p.add_argument("--zoo", action="append", default=[], metavar="BACKEND=EVAL.json")
    p.add_argument("--zoo-note", default="", help="where and with what the zoo figures came")
    p.add_argument("--zoo-log", type=Path, help="lines 'MODEL BACKEND SECONDS s KB KB'")
    p.add_argument("--machine-note", default="", help="a line on the machine (e.g. shared)")
    p.add_argument("--peers", type=Path, help="the peer quantizers' markdown tables")
    p.add_argument("--section", action="append", default=[], metavar="TITLE=EVAL.json")
    args = p.parse_args(argv)
    sections = _pairs(args.section, "--section")
    lines = [
        "# Results",
        "",
        "Generated by `scripts/results_page.py`; rerun it to refresh this page. Figures "
        "measured in this run come from this machine:",
        "",
        *machine(),
        *([f"- {args.machine_note}"] if args.machine_note else []),
        "",
        *([] if args.no_example else example_section()),
        *zoo_section(args.zoo_float, _pairs(args.zoo, "--zoo"), args.zoo_log, args.zoo_note),
        *peers_section(args.peers),
        *side_by_side(_pairs(args.zoo, "--zoo"), args.peers),
    ]
    for title in dict.fromkeys([*KNOWN_SECTIONS, *sections]):
        lines += extra_section(title, sections.get(title))
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
