"""Accuracy recovery on a model zoo: quantize every model with each recovery setting, time it,
evaluate it, and print one table per model.

Usage::

    python scripts/bench_recovery.py --zoo /path/to/zoo --models ~/.cache/onnxq-zoo/models \\
        --calib /path/to/calib --out /tmp/recovery [--only a,b] [--backends tensorrt,onnxruntime] \\
        [--settings default,cle,prefix] [--jobs-log out.jsonl]

For each model, backend and setting (:data:`SETTINGS`) it runs ``onnxq quantize`` in a child
process (wall time and peak RSS from ``/usr/bin/time``), then the zoo's ``zoo.py eval`` on the
output (``--json``), and appends one JSON line per run to ``OUT/runs.jsonl`` (a run already
there is not repeated, so the script resumes).  A setting whose output is byte-identical to
the default's (the algorithm found nothing to do in that model) is not evaluated again.  The
tables give the labelled score, the output fidelity that TensorRT computes (``fidelity_unfused``)
and the quantize time; the machine is whatever runs the script (say which CPU it was).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS: dict[str, list[str]] = {
    "default": [],
    "no-smoothquant": ["--no-smoothquant"],
    "cle": ["--cle"],
    "smoothquant": ["--smoothquant", "0.5"],
    "smoothquant-0.8": ["--smoothquant", "0.8"],
    "prefix": ["--calibration-mode", "prefix"],
    "dw-equalization": ["--dw-equalization"],
    "prefix+dw-equalization": ["--calibration-mode", "prefix", "--dw-equalization"],
    "adaround": ["--adaround"],
    "bias-correction": ["--bias-correction"],
    "prefix+adaround": ["--calibration-mode", "prefix", "--adaround"],
    "smoothquant-0.8+adaround": ["--smoothquant", "0.8", "--adaround"],
    "prefix+bias-correction": ["--calibration-mode", "prefix", "--bias-correction"],
    "prefix+adaround+bias-correction": [
        "--calibration-mode", "prefix", "--adaround", "--bias-correction",
    ],
    "sequential-adaround": ["--adaround-mode", "sequential"],
    "prefix+sequential-adaround": ["--calibration-mode", "prefix", "--adaround-mode", "sequential"],
    "prefix+sequential-adaround+sequential-correction": [
        "--calibration-mode", "prefix", "--adaround-mode", "sequential", "--sequential-correction",
    ],
    "block-adaround": [
        "--adaround-mode", "block", "--set", "recovery.adaround_steps=200",
        "--adaround-engine", "torch",
    ],
    "prefix+dw-equalization+block-adaround": [
        "--calibration-mode", "prefix", "--dw-equalization", "--adaround-mode", "block",
        "--set", "recovery.adaround_steps=200", "--adaround-engine", "torch",
    ],
    "shift-activations": ["--shift-activations"],
    "adaround+shift-activations": ["--adaround", "--shift-activations"],
    "prefix+dw-equalization+adaround+shift-activations": [
        "--calibration-mode", "prefix", "--dw-equalization", "--adaround", "--shift-activations",
    ],
    "prefix-percentile": ["--calibration-mode", "prefix", "--method", "percentile"],
    "prefix-entropy": ["--calibration-mode", "prefix", "--method", "entropy"],
    "prefix-mse": ["--calibration-mode", "prefix", "--method", "mse"],
    "all": ["--cle", "--smoothquant", "0.8", "--calibration-mode", "prefix", "--adaround"],
}  # fmt: skip
MODELS = [
    "digits_cnn",
    "mtcnn_pnet",
    "mtcnn_rnet",
    "mtcnn_onet",
    "ppocr_mobile_v2_cls",
    "ppocrv4_det",
    "ppocrv4_rec",
    "mobilenet_v2",
    "all_minilm_l6_v2",
    "silero_vad",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", required=True, help="folder with zoo.py")
    p.add_argument("--models", required=True, help="folder of the float models")
    p.add_argument("--calib", required=True, help="folder with one calibration folder per model")
    p.add_argument("--out", required=True)
    p.add_argument("--only", default=",".join(MODELS))
    p.add_argument("--backends", default="tensorrt,onnxruntime")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--table", action="store_true", help="only print the tables of runs.jsonl")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    if not args.table:
        for model in args.only.split(","):
            for backend in args.backends.split(","):
                for setting in args.settings.split(","):
                    run_one(args, out, log, model, backend, setting)
    print(tables(log))
    return 0


def run_one(args, out: Path, log: Path, model: str, backend: str, setting: str) -> None:
    done = {(r["model"], r["backend"], r["setting"]) for r in read(log)}
    if (model, backend, setting) in done:
        return
    folder = out / backend / setting
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{model}.onnx"
    cmd = [
        "/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "onnxq.cli", "quantize",
        str(Path(args.models) / f"{model}.onnx"), "-o", str(target),
        "--calib", str(Path(args.calib) / model), "--backend", backend,
        "--report", str(folder / f"{model}.json"), "-q", *SETTINGS[setting],
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    record: dict[str, object] = {"model": model, "backend": backend, "setting": setting}
    if proc.returncode != 0:
        record["error"] = proc.stderr.strip().splitlines()[-1:]
        append(log, record)
        return
    seconds, kb = proc.stderr.strip().splitlines()[-1].split()
    record.update(seconds=float(seconds), rss_mb=int(kb) // 1024, wall=time.time() - started)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    record["sha256"] = digest
    same = [
        r
        for r in read(log)
        if r["model"] == model and r["backend"] == backend and r.get("sha256") == digest
    ]
    if same and "eval" in same[0]:
        record["eval"] = same[0]["eval"]
        record["same_as"] = same[0]["setting"]
    else:
        record["eval"] = evaluate(args, folder, model)
    append(log, record)


def evaluate(args, folder: Path, model: str) -> dict[str, object]:
    result = folder / f"{model}.eval.json"
    subprocess.run(
        [
            sys.executable,
            "zoo.py",
            "eval",
            "--models",
            str(folder),
            "--ref",
            args.models,
            "--only",
            model,
            "--json",
            str(result),
        ],
        cwd=args.zoo,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    data = json.loads(result.read_text())
    entry = data.get(model, data)
    keys = ("score", "score_unfused", "fidelity", "fidelity_unfused", "error")
    return {key: entry.get(key) for key in keys}


def read(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def append(log: Path, record: dict[str, object]) -> None:
    with log.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def tables(log: Path) -> str:
    runs = read(log)
    lines = []
    for model in dict.fromkeys(r["model"] for r in runs):
        lines += [f"\n### {model}\n", "| backend | setting | score | fidelity (unfused) | s |"]
        lines.append("|---|---|---|---|---|")
        for r in (r for r in runs if r["model"] == model):
            if "error" in r and "eval" not in r:
                lines.append(f"| {r['backend']} | {r['setting']} | error: {r['error']} | | |")
                continue
            ev = r["eval"]
            fid = ", ".join(
                f"{k.removesuffix('_cos').removesuffix('_agreement')}: {v:.4f}"
                for k, v in sorted(ev.get("fidelity_unfused", {}).items())
                if k.endswith(("_cos", "_agreement")) and isinstance(v, (int, float))
            )
            same = f" (= {r['same_as']})" if r.get("same_as") else ""
            score = ev.get("score_unfused")
            score_text = f"{score:.4f}" if isinstance(score, (int, float)) else str(score)
            lines.append(
                f"| {r['backend']} | {r['setting']}{same} | {score_text} | {fid} | "
                f"{r['seconds']:.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
