"""Proxy perplexity of causal language models on the first windows of the zoo's evaluation ids.

Usage::

    python scripts/lm_perplexity.py MODEL.onnx [MODEL.onnx ...] [--windows 8]
        [--eval-ids ZOO_DIR/data/lm/eval_ids.npy]

Each model runs in onnxruntime with graph optimizations off, so a Q/DQ model computes the
graph's own arithmetic (what TensorRT computes; no fused int8 CPU kernels).  Every token after
the first of each window is predicted; the perplexity is ``exp`` of the mean negative
log-likelihood over all of them (``zoo.py eval``'s measure, which takes 64 windows).  Prints one
line per model, with the CPU and the onnxruntime version.
"""

from __future__ import annotations

import argparse
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np
from zoo_paths import ZOO


def perplexity(path: Path, ids: np.ndarray) -> float:
    """Perplexity of the model at ``path`` over the windows ``ids`` ([windows, tokens])."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    nll, _, count = window_scores(session, ids)
    return math.exp(nll / count)


def window_scores(session: Any, ids: np.ndarray) -> tuple[float, int, int]:
    """Over the windows ``ids`` ([windows, tokens]) run one at a time through the onnxruntime
    ``session`` (``input_ids``, ``attention_mask`` if it takes one -> ``logits``): the summed
    negative log-likelihood of every token after the first, the number predicted top-1, and
    the number of tokens scored."""
    inputs = {i.name for i in session.get_inputs()}
    nll, hits, count = 0.0, 0, 0
    for window in ids:
        feed = {"input_ids": window[None].astype(np.int64)}
        if "attention_mask" in inputs:
            feed["attention_mask"] = np.ones_like(feed["input_ids"])
        logits = session.run(["logits"], feed)[0][0, :-1].astype(np.float64)
        target = window[1:]
        top = logits.max(-1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
        nll += float((lse - logits[np.arange(len(target)), target]).sum())
        hits += int((logits.argmax(-1) == target).sum())
        count += len(target)
    return nll, hits, count


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    import onnxruntime as ort

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--eval-ids", type=Path, default=ZOO / "data" / "lm" / "eval_ids.npy")
    args = p.parse_args()
    ids = np.load(args.eval_ids)[: args.windows]
    print(f"cpu: {cpu_name()}, onnxruntime {ort.__version__}")
    print(f"windows: {len(ids)} of {ids.shape[1]} tokens")
    for path in args.models:
        print(f"{path}: perplexity {perplexity(path, ids):.3f}", flush=True)


if __name__ == "__main__":
    main()
