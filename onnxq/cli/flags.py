"""Flag helpers shared by the ``onnxq`` subcommands: the help epilog, the precision flags,
the positive-integer argument type, and the flags that moved to ``--set``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# flags of ``onnxq quantize`` that moved to ``--set SECTION.FIELD=VALUE``, and where they went;
# one of them on the command line is a one-line error that says so (refuse_moved)
MOVED: dict[str, str] = {
    "--histogram-sample": "calibration.histogram_sample",
    "--histogram-budget": "calibration.histogram_budget",
    "--adaround-steps": "recovery.adaround_steps",
    "--range-search-batches": "recovery.range_search_batches",
    "--heldout-batches": "accuracy.heldout_batches",
}


def refuse_moved(argv: Sequence[str]) -> None:
    """Raise :class:`~onnxq.errors.ConfigError` naming the ``--set`` path of the first flag of
    ``onnxq quantize ARGV`` that moved (:data:`MOVED`; also as ``--flag=VALUE``), before the
    parser would call it unknown; the value given, if any, goes into the ``--set`` it names."""
    from onnxq.errors import ConfigError

    words = list(argv)
    command = next((w for w in words if not w.startswith("-")), None)
    if command != "quantize":
        return
    for i, word in enumerate(words):
        if word == "--":  # the rest are operands, not flags
            return
        flag, eq, value = word.partition("=")
        if flag not in MOVED:
            continue
        if not eq:
            after = words[i + 1] if i + 1 < len(words) else ""
            value = after if after and not after.startswith("-") else ""
        raise ConfigError(
            f"{flag} moved: use --set {MOVED[flag]}={value or 'N'} "
            "(onnxq quantize --help-all lists every field)"
        )


EPILOG = """\
calibration data (--calib):
  a folder of .npz files, one batch per file, keys = model input names (file-name order);
  a folder of .npy files (single-input models); one .npz whose arrays share a leading
  sample axis (cut into --batch-size batches); or a folder of images (jpg/png/bmp/webp)
  with --preprocess (imagenet | 0-1 | tf | a spec, see docs/calibration.md).

examples:
  onnxq quantize model.onnx -o model.int8.onnx --calib calib/
  onnxq quantize lm.onnx -o lm.int4.onnx --weights int4 --calib calib/ --backend onnxruntime
  onnxq quantize model.onnx -o out.onnx --calib calib/ --backend onnxruntime --report r.json
  onnxq check model.int8.onnx --backend tensorrt
  onnxq explain model.onnx --backend tensorrt

exit codes: 0 ok, 1 check found violations (or an accuracy target was missed), 2 user
error (bad input, options or data), 3 internal error (a bug in onnxq: please report it),
130 interrupted.
"""

Flags = argparse._ActionsContainer  # a parser or one of its argument groups


def precision_flags(
    parser: Flags, placement: Flags | None = None, high_precision: bool = True
) -> None:
    """--precision, --high-precision, --dynamic and (in ``placement``, else ``parser``)
    --dynamic-weight-scales
    (docs/precisions.md)."""
    from onnxq.config.placement import DYNAMIC_WEIGHT_SCALES, HIGH_PRECISIONS
    from onnxq.numerics.precisions import PRECISIONS

    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        help="element type of the quantized tensors: int8 (default), int16 (16-bit "
        "activations, 8-bit weights; --backend onnxruntime) or fp8 (FP8 E4M3; --backend "
        "tensorrt); docs/precisions.md",
    )
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="dynamic quantization (--backend onnxruntime): int8 weights, activations "
        "quantized at run time; no --calib needed (given, it feeds the fidelity check)",
    )
    if high_precision:  # quantize's alone: the plan reads the calibration's peaks
        parser.add_argument(
            "--high-precision",
            choices=list(HIGH_PRECISIONS),
            help="what the float compute onnxq does not quantize is written in: fp16 "
            "(TensorRT's default: its networks are strongly typed since TensorRT 11; FP32 "
            "where the calibration data overflows FP16, with the reason) or fp32 "
            "(onnxruntime's default); bf16 is refused until onnxruntime can check it; "
            "docs/tensorrt11.md",
        )
    (placement or parser).add_argument(
        "--dynamic-weight-scales",
        choices=list(DYNAMIC_WEIGHT_SCALES),
        help="with --dynamic: one scale per weight where that keeps its SQNR >= 30 dB, else "
        "one per output column (auto, default; onnxruntime runs one scale faster on few rows, "
        "as in a one-token generation step), one per column everywhere (channel: most "
        "accurate) or one per weight everywhere (tensor: fastest)",
    )


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def selection_flags(parser: Flags) -> None:
    """--exclude-op-type and --exclude-module (placement selections beside --exclude)."""
    parser.add_argument(
        "--exclude-op-type",
        action="append",
        metavar="GLOB",
        default=None,
        help="op type that stays float, e.g. Softmax (glob, repeatable)",
    )
    parser.add_argument(
        "--exclude-module",
        action="append",
        metavar="GLOB",
        default=None,
        help="exporter module path whose nodes stay float, e.g. 'encoder.*.attn*' (glob over "
        "the nodes' module metadata of a torch.onnx dynamo export, else over TorchScript "
        "node-name scopes; repeatable)",
    )


def target_flags(parser: Flags) -> None:
    """--target-cpu and --cost-table (the onnxruntime backend's CPU tuning)."""
    from onnxq.backends.cpu import CPU_CLASSES

    parser.add_argument(
        "--target-cpu",
        choices=list(CPU_CLASSES),
        help="CPU class the onnxruntime output is tuned for (default: this machine's, or "
        "$ONNXQ_TARGET_CPU): uint8-stored weights on x86-avx2, cost thresholds",
    )
    parser.add_argument(
        "--cost-table",
        metavar="FILE.json",
        help="cost thresholds measured by `onnxq tune-cpu` (default: the shipped table of "
        "the target class)",
    )
