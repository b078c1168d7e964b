"""The ``onnxq`` command line: its parser and subcommands (what ``--help`` says); the flags of
``quantize`` are in :mod:`onnxq.cli.quantize_flags`."""

from __future__ import annotations

import argparse
from typing import Any

from onnxq.backends.profile import BACKENDS
from onnxq.cli.flags import EPILOG, positive, precision_flags, selection_flags, target_flags
from onnxq.cli.quantize_flags import add_quantize


def build_parser() -> argparse.ArgumentParser:
    """The ``onnxq`` parser with every subcommand."""
    from onnxq.version import __version__

    p = argparse.ArgumentParser(
        prog="onnxq",
        description="Post-training INT8 quantization of ONNX models to Q/DQ "
        "format that onnxruntime runs and TensorRT accepts.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"onnxq {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_quantize(sub)
    _check(sub)
    _inspect(sub)
    _analyze(sub)
    _explain(sub)
    _tune(sub)
    return p


def _check(sub: Any) -> None:
    """``onnxq check``."""
    c = sub.add_parser(
        "check",
        help="list backend constraint violations of a Q/DQ model",
        description="Check a Q/DQ model against a backend's constraints: zero "
        "points, scale values and shapes, per-axis scales only on weights, weight "
        "axes, opset, forbidden ops. Exit 1 if any violation.",
    )
    c.add_argument("model")
    c.add_argument("--backend", choices=BACKENDS, default="tensorrt")
    c.add_argument(
        "--engine",
        action="store_true",
        help="also build a TensorRT engine (10.x or 11.x) and report each layer's precision "
        "and the quantized ONNX nodes that do not run in INT8 (needs the tensorrt package "
        "and an NVIDIA GPU)",
    )
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=1x3x224x224",
        help="input shape for the engine build when the input is dynamic",
    )


def _inspect(sub: Any) -> None:
    """``onnxq inspect``."""
    i = sub.add_parser(
        "inspect",
        help="show the bit width and observer of each quantized tensor",
        description="Read the per-tensor records (bits, method, axis) that onnxq "
        "writes into a quantized model's metadata.",
    )
    i.add_argument("model")


def _analyze(sub: Any) -> None:
    """``onnxq analyze``."""
    a = sub.add_parser(
        "analyze",
        help="per-layer error of a quantized model vs its float model",
        description="Run the float and the quantized model on calibration data and report, "
        "per tensor, the accumulated error (everything up to it quantized) and, per quantized "
        "op, the local error (the op alone quantized) as SQNR and cosine; the ops are ranked "
        "by their local error (where the error jumps), each with what should help.",
    )
    a.add_argument("float_model")
    a.add_argument("quant_model")
    a.add_argument("--calib", required=True, metavar="DATA")
    a.add_argument("--preprocess", metavar="SPEC", help="for an image folder (see quantize)")
    a.add_argument("--report", metavar="FILE", help="write the table as .json or .html")
    a.add_argument("--max-batches", type=positive, default=16)
    a.add_argument(
        "--fused",
        action="store_true",
        help="run the quantized model with onnxruntime's int8 fusion (default: off)",
    )
    a.add_argument(
        "--top", type=positive, default=15, help="print the N worst tensors (default 15)"
    )
    a.add_argument(
        "--sensitivity",
        nargs="?",
        const="tensorrt",
        choices=BACKENDS,
        metavar="BACKEND",
        help="also rank the layers by how much the output cosine gains when each alone stays "
        "float, quantizing FLOAT for BACKEND (default tensorrt) from --calib, one calibration "
        "(what --target searches over)",
    )
    a.add_argument(
        "--memory-budget",
        type=positive,
        metavar="MB",
        help="activation memory per batch (default 4096, as calibration's); above it the "
        "tensors are compared in several passes",
    )


def _explain(sub: Any) -> None:
    """``onnxq explain``."""
    from onnxq.place.exclusions import EXCLUSIONS

    e = sub.add_parser(
        "explain",
        help="per op: quantized (which rule) or why not",
        description="Show where onnxq would place Q/DQ and why each op stays "
        "float, without calibrating. Rules that read the calibration data "
        f"({', '.join(e.option for e in EXCLUSIONS)}) can keep "
        "more ops float in `onnxq quantize`; its report gives those reasons.",
    )
    e.add_argument("model")
    e.add_argument(
        "--backend", choices=BACKENDS, help="target backend (default: the config's, else tensorrt)"
    )
    e.add_argument("--config", metavar="FILE.yaml")
    e.add_argument("--exclude", action="append", metavar="GLOB", default=None)
    selection_flags(e)
    target_flags(e)
    precision_flags(e, high_precision=False)


def _tune(sub: Any) -> None:
    """``onnxq tune-cpu``."""
    t = sub.add_parser(
        "tune-cpu",
        help="measure onnxruntime's int8-vs-float cost thresholds on this CPU",
        description="Time small int8 and float convs with onnxruntime on this machine (one "
        "thread, under a minute) and write the cost table that --backend onnxruntime "
        "uses to decide where int8 pays (pass it with --cost-table). Run it on a quiet "
        "machine of the class you deploy on, and check a model's speed with "
        "scripts/bench_latency.py: per-op thresholds cannot see whole chains.",
    )
    t.add_argument("-o", "--output", required=True, help="table file to write (.json)")
    t.add_argument("--runs", type=positive, default=60, help="timed runs per model (default 60)")


def selections(args: argparse.Namespace) -> dict[str, Any]:
    """The selection flags as QuantConfig options (None: the config's)."""
    return {
        "exclude_op_types": tuple(args.exclude_op_type) if args.exclude_op_type else None,
        "exclude_modules": tuple(args.exclude_module) if args.exclude_module else None,
    }
