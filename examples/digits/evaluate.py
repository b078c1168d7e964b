"""Float vs INT8, side by side: file size, latency in onnxruntime and accuracy on held-out digits.

Usage::

    python examples/digits/evaluate.py QUANT.onnx [--float FLOAT.onnx] [--eval EVAL.npz]
                                       [--runs 200]

``--float`` and ``--eval`` default to ``digits_cnn.onnx`` and ``eval.npz`` next to this script.
Both models run in onnxruntime's CPU provider: "fused" is the default session (onnxruntime folds
QuantizeLinear/DequantizeLinear pairs into int8 kernels: what a deployment runs), "unfused" has
every graph optimization off (the Q/DQ graph's own float arithmetic: what TensorRT computes).
Latency: one image per run, one thread, the two models in turns, median of ``--runs``.
Needs only numpy and onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
WEIGHTED_OPS = ("Conv", "Gemm", "MatMul")


def make_session(model: Path, *, optimize: bool) -> ort.InferenceSession:
    """A one-thread CPU session; ``optimize=False`` disables all graph optimizations."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
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


def int8_weighted_ops(model: Path) -> tuple[int, int]:
    """(Conv/Gemm/MatMul nodes whose data and weight are dequantized INT8, all of them)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    weighted = [n for n in graph.node if n.op_type in WEIGHTED_OPS]
    return sum(all(i in dequantized for i in n.input[:2]) for n in weighted), len(weighted)


def paired_latency_ms(
    a: ort.InferenceSession, b: ort.InferenceSession, x: np.ndarray, runs: int
) -> tuple[float, float]:
    """Median milliseconds of one run of ``a`` and of ``b`` on ``x``, measured in turns."""
    times: tuple[list[float], list[float]] = ([], [])
    for sess in (a, b):  # warm-up
        run_logits(sess, x)
    for _ in range(runs):
        for sess, out in zip((a, b), times, strict=True):
            start = time.perf_counter()
            run_logits(sess, x)
            out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def comparison(args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """The rows of the side-by-side table: (what, float, int8, ratio or note)."""
    x, labels = load_eval(args.eval_data)
    float_sess = make_session(args.float_model, optimize=True)
    fused = make_session(args.quant, optimize=True)
    float_logits, fused_logits = run_logits(float_sess, x), run_logits(fused, x)
    unfused_logits = run_logits(make_session(args.quant, optimize=False), x)
    float_ms, int8_ms = paired_latency_ms(float_sess, fused, x[:1], args.runs)
    float_size, int8_size = (os.path.getsize(p) for p in (args.float_model, args.quant))
    done, total = int8_weighted_ops(args.quant)

    def acc(logits: np.ndarray) -> float:
        return float((logits.argmax(axis=1) == labels).mean())

    agree = float((fused_logits.argmax(1) == float_logits.argmax(1)).mean())
    return [
        ("file size", f"{float_size / 1e3:.0f} kB", f"{int8_size / 1e3:.0f} kB",
         f"{float_size / int8_size:.1f}x smaller"),
        ("latency, 1 image, 1 thread", f"{float_ms:.3f} ms", f"{int8_ms:.3f} ms",
         f"{float_ms / int8_ms:.2f}x faster" if int8_ms < float_ms
         else f"{int8_ms / float_ms:.2f}x slower"),
        (f"accuracy ({len(labels)} held-out digits)", f"{acc(float_logits):.4f}",
         f"{acc(fused_logits):.4f}", f"unfused {acc(unfused_logits):.4f}"),
        ("top-1 agreement with float", "1.0000", f"{agree:.4f}", ""),
        ("Conv/Gemm/MatMul in INT8", "-", f"{done} of {total}", ""),
    ]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description="Float vs INT8 digits model: size, latency and accuracy (onnxruntime CPU)."
    )
    parser.add_argument("quant", type=Path, help="quantized ONNX model")
    parser.add_argument(
        "--float", dest="float_model", type=Path, default=HERE / "digits_cnn.onnx",
        help="float ONNX model (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--eval", dest="eval_data", type=Path, default=HERE / "eval.npz",
        help="evaluation data with keys input and labels (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=200, help="timed runs per model")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the side-by-side table; return the process exit code."""
    args = parse_args(argv)
    for path in (args.quant, args.float_model, args.eval_data):
        if not path.is_file():
            print(f"error: file not found: {path}", file=sys.stderr)
            return 2
    try:
        rows = comparison(args)
    except Exception as exc:  # report any load/run failure on one line
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    header = ("", "float", "int8", "")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    print(f"onnxruntime {ort.__version__}, CPU provider; int8 = {args.quant}")
    for row in [header, *rows]:
        print("  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))).rstrip())  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
