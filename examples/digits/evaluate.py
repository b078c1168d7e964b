"""Compare a quantized digits model against the float model on the held-out evaluation set.

Usage::

    python examples/digits/evaluate.py QUANT.onnx [--float FLOAT.onnx] [--eval EVAL.npz]

``--float`` and ``--eval`` default to ``digits_cnn.onnx`` and ``eval.npz`` next to this script.
The quantized model is run twice with onnxruntime's CPU provider: with default session options
("fused": onnxruntime folds QuantizeLinear/DequantizeLinear pairs into integer kernels) and with
``graph_optimization_level = ORT_DISABLE_ALL`` ("unfused": the Q/DQ graph's own float arithmetic).
Needs only numpy and onnxruntime.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent


def make_session(model: Path, *, optimize: bool) -> ort.InferenceSession:
    """Create a CPU session; ``optimize=False`` disables all graph optimizations."""
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(model), sess_options=opts, providers=["CPUExecutionProvider"])


def run_logits(sess: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    """Run ``sess`` on ``x`` (fed to its first input) and return its first output."""
    name = sess.get_inputs()[0].name
    return np.asarray(sess.run(None, {name: x})[0])


def load_eval(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Load ``input`` (float32 [N,1,8,8]) and ``labels`` (int64 [N]) from an ``.npz`` file."""
    with np.load(path, allow_pickle=False) as data:
        missing = {"input", "labels"} - set(data.files)
        if missing:
            raise ValueError(f"{path}: missing key(s) {', '.join(sorted(missing))}")
        return data["input"].astype(np.float32), data["labels"].astype(np.int64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description="Accuracy of a quantized digits model vs. the float model (onnxruntime CPU)."
    )
    parser.add_argument("quant", type=Path, help="quantized ONNX model")
    parser.add_argument(
        "--float",
        dest="float_model",
        type=Path,
        default=HERE / "digits_cnn.onnx",
        help="float ONNX model (default: %(default)s)",
    )
    parser.add_argument(
        "--eval",
        dest="eval_data",
        type=Path,
        default=HERE / "eval.npz",
        help="evaluation data with keys input and labels (default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print the comparison table; return the process exit code."""
    args = parse_args(argv)
    for path in (args.quant, args.float_model, args.eval_data):
        if not path.is_file():
            print(f"error: file not found: {path}", file=sys.stderr)
            return 2

    try:
        x, labels = load_eval(args.eval_data)
        float_logits = run_logits(make_session(args.float_model, optimize=True), x)
        fused_logits = run_logits(make_session(args.quant, optimize=True), x)
        unfused_logits = run_logits(make_session(args.quant, optimize=False), x)
    except Exception as exc:  # report any load/run failure on one line
        msg = " ".join(str(exc).split())
        print(f"error: {type(exc).__name__}: {msg}", file=sys.stderr)
        return 2

    float_pred = float_logits.argmax(axis=1)
    fused_pred = fused_logits.argmax(axis=1)
    unfused_pred = unfused_logits.argmax(axis=1)
    n = len(labels)

    def acc(pred: np.ndarray) -> float:
        return float((pred == labels).mean())

    rows = [
        ("float accuracy", f"{acc(float_pred):.4f}"),
        ("int8 accuracy (fused)", f"{acc(fused_pred):.4f}"),
        ("int8 accuracy (unfused)", f"{acc(unfused_pred):.4f}"),
        ("top-1 agreement with float (fused)", f"{float((fused_pred == float_pred).mean()):.4f}"),
        (
            "top-1 agreement with float (unfused)",
            f"{float((unfused_pred == float_pred).mean()):.4f}",
        ),
        ("max |logit diff| vs float (fused)", f"{np.abs(fused_logits - float_logits).max():.4g}"),
        (
            "max |logit diff| vs float (unfused)",
            f"{np.abs(unfused_logits - float_logits).max():.4g}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"eval samples: {n}  ({args.eval_data})")
    print(f"float model:  {args.float_model}")
    print(f"quant model:  {args.quant}")
    print("-" * (width + 10))
    for key, value in rows:
        print(f"{key:<{width}}  {value:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
