"""The ``onnxq`` command line: its parser, subcommands and flags (what ``--help`` says)."""

from __future__ import annotations

import argparse
from typing import Any

from onnxq.backends.profile import BACKENDS
from onnxq.config.options import TARGET_COSTS

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


# the options ``onnxq quantize --help`` shows: the ones a user needs in the first hour; the
# others are grouped by config section under ``--help-all`` (tests/cli/test_parser.py)
FIRST_LEVEL = frozenset(
    {
        "help",
        "help_all",
        "model",
        "output",
        "calib",
        "backend",
        "method",
        "precision",
        "dynamic",
        "weights",
        "config",
        "set",
        "exclude",
        "report",
        "preprocess",
        "max_batches",
        "batch_size",
        "save_calibration",
        "load_calibration",
        "target",
        "ray",
        "device",
        "external_data",
        "quiet",
    }
)


class _FirstLevel(argparse.RawDescriptionHelpFormatter):
    """``--help``: only the first-level options, in the usage line too."""

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any = None) -> None:
        shown = [a for a in actions if a.dest in FIRST_LEVEL or not a.option_strings]
        super().add_usage(usage, shown, groups, prefix)

    def add_argument(self, action: argparse.Action) -> None:
        if action.dest in FIRST_LEVEL or not action.option_strings:
            super().add_argument(action)


class _HelpAll(argparse.Action):
    """``--help-all``: every option, grouped by config section, then the fields that only
    ``--set`` reaches."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = set_fields_text(parser) + "\n" + (parser.epilog or "")
        parser.print_help()
        parser.exit()


def set_fields_text(parser: argparse.ArgumentParser) -> str:
    """The config fields by section, as ``--set SECTION.FIELD=VALUE`` takes them (a field a flag
    also sets names the flag)."""
    from onnxq.config import QuantConfig
    from onnxq.config.sections import SECTIONS

    defaults = QuantConfig().to_dict()
    flag_of = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    lines = ["config fields (--set SECTION.FIELD=VALUE; a YAML file may nest them the same way):"]
    for section, (what, names) in SECTIONS.items():
        lines.append(f"  {section}: {what}")
        for name in names:
            flag = _FLAG_OF_FIELD.get(name) or flag_of.get(name)
            also = f"  ({flag})" if flag else ""
            lines.append(f"    {section}.{name}={defaults[name]!r}{also}")
    return "\n".join(lines) + "\n"


# config fields whose flag has another name
_FLAG_OF_FIELD = {
    "target_accuracy": "--target",
    "weight_only": "--weights",
    "weight_algorithm": "--algorithm",
    "memory_budget_mb": "--memory-budget",
    "simplify": "--no-simplify",
    "progress": "--quiet",
    "exclude_op_types": "--exclude-op-type",
    "exclude_modules": "--exclude-module",
}


def build_parser() -> argparse.ArgumentParser:
    from onnxq.numerics.observers import METHODS
    from onnxq.place.exclusions import EXCLUSIONS
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

    q = sub.add_parser(
        "quantize",
        help="quantize a float ONNX model",
        description="Quantize a float ONNX model to INT8 Q/DQ.\n\n--help shows the options of "
        "the first hour; --help-all shows every option, grouped by\nconfig section, and every "
        "config field, which --set SECTION.FIELD=VALUE reaches.",
        epilog=EPILOG,
        formatter_class=_FirstLevel,
    )
    q.add_argument(
        "--help-all", action=_HelpAll, help="every option, grouped by config section, and exit"
    )
    from onnxq.config.sections import SECTIONS

    # the second-level options, one group per config section (shown by --help-all)
    sec = {name: q.add_argument_group(f"{name}: {what}") for name, (what, _) in SECTIONS.items()}
    q.add_argument("model", help="float ONNX model (never modified)")
    q.add_argument("-o", "--output", required=True, help="output .onnx path (written atomically)")
    q.add_argument("--calib", metavar="DATA", help="calibration data (see below)")
    q.add_argument(
        "--backend",
        choices=BACKENDS,
        help="target backend (default tensorrt: symmetric int8, per-channel weights)",
    )
    q.add_argument(
        "--method",
        choices=sorted(METHODS),
        help="activation range method (default: the config's, else auto: per tensor the "
        "method with the least expected quantization error)",
    )
    sec["placement"].add_argument(
        "--method-for",
        action="append",
        default=[],
        metavar="GLOB=METHOD",
        help="per-tensor method: tensors whose name, or whose reading node's name, "
        "matches GLOB use METHOD (repeatable; later wins)",
    )
    sec["calibration"].add_argument(
        "--percentile", type=float, help="percentile kept by --method percentile (default 99.99)"
    )
    _precision_flags(q, sec["placement"])
    q.add_argument("--config", metavar="FILE.yaml", help="QuantConfig YAML (see docs/config.md)")
    q.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="set any config field, e.g. recovery.adaround=true or calibration.percentile=99.9 "
        "(repeatable; over --config; --help-all lists the sections and fields)",
    )
    q.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        default=None,
        help="node-name glob that stays float (repeatable); a name that matches no node "
        "but a tensor (as `onnxq analyze` lists them) keeps the tensor's producer float",
    )
    _selection_flags(sec["placement"])
    q.add_argument("--report", metavar="FILE", help="write the report as .json or .html")
    q.add_argument(
        "--preprocess",
        metavar="SPEC",
        help="image folder preprocessing: imagenet, 0-1, tf, or a spec like "
        "'resize=256,crop=224,scale=1/255,mean=0.485:0.456:0.406,"
        "std=0.229:0.224:0.225,order=rgb,layout=nchw'",
    )
    q.add_argument("--max-batches", type=int, help="use at most N calibration batches")
    q.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="batch size when --calib is one .npz of samples (default 1)",
    )
    q.add_argument(
        "--save-calibration",
        metavar="FILE.json",
        help="write the observed statistics (reusable with any --method, with the same --backend)",
    )
    q.add_argument(
        "--load-calibration",
        metavar="FILE.json",
        help="quantize from saved statistics instead of data (--calib then only "
        "feeds the fidelity check and may be omitted)",
    )
    sec["calibration"].add_argument(
        "--memory-budget",
        type=int,
        metavar="MB",
        help="activation memory per batch during calibration (default 4096); "
        "above it tensors are observed in several passes",
    )
    sec["calibration"].add_argument(
        "--histogram-sample",
        type=int,
        metavar="N",
        help="values per sample that enter a histogram (default 65536; larger "
        "samples contribute every s-th value; 0 = every value, slower)",
    )
    sec["calibration"].add_argument(
        "--histogram-budget",
        type=int,
        metavar="N",
        help="values one tensor's histogram counts over the whole calibration "
        "(default 16777216): beyond 256 samples each contributes fewer; 0 = no "
        "budget",
    )
    q.add_argument(
        "--target",
        metavar="METRIC=VALUE",
        help="accuracy target on held-out batches, e.g. cosine=0.999 (metrics: cosine, "
        "sample_cosine, sqnr, top1): keep the fewest, most harmful layers float until it "
        "holds; exit 1 (the best model is still written) when it cannot",
    )
    sec["accuracy"].add_argument(
        "--heldout",
        metavar="DATA",
        help="data to measure --target on (default: the first --heldout-batches calibration "
        "batches, which calibration then skips)",
    )
    sec["accuracy"].add_argument(
        "--heldout-batches",
        type=_positive,
        help="batches held out for --target (default 16)",
    )
    sec["accuracy"].add_argument(
        "--target-cost",
        choices=TARGET_COSTS,
        help="what --target's search keeps small: layers (the fewest float layers, default) or "
        "macs (the fewest multiply-adds left out of INT8, by gain per multiply-add)",
    )
    sec["accuracy"].add_argument(
        "--target-max-float-macs",
        metavar="SHARE",
        help="the most of the model's multiply-adds --target's search may leave out of INT8, "
        "e.g. 10%% or 0.1: it keeps the best model within it, exit 1 when that misses the "
        "target (default: no ceiling)",
    )
    q.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="observe the calibration batches, and run --target's sensitivity trials, as Ray "
        "tasks: auto (the cluster of `ray start`), host:port, ray://host:10001, or local (Ray "
        "on this machine); the output is the same as without (needs onnxq[ray]; "
        "docs/scale.md)",
    )
    q.add_argument(
        "--device",
        metavar="DEVICE",
        help="where calibration and validation run: cpu (default), cuda or cuda:N "
        "(needs onnxruntime-gpu)",
    )
    _target_flags(sec["profile"])
    _weight_only_flags(q, sec["weightonly"])
    from onnxq.cli.recovery import add_recovery_flags

    add_recovery_flags(sec["recovery"])
    sec["run"].add_argument("--no-simplify", action="store_true", help="skip the simplify passes")
    q.add_argument(
        "--external-data",
        action="store_true",
        help="store weights in OUT.data beside the model (automatic above 2 GB)",
    )
    q.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar, no summary (warnings still go to stderr)",
    )

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
        help="also build a TensorRT engine and report per-layer precision (needs the "
        "tensorrt package and an NVIDIA GPU)",
    )
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=1x3x224x224",
        help="input shape for the engine build when the input is dynamic",
    )

    i = sub.add_parser(
        "inspect",
        help="show the bit width and observer of each quantized tensor",
        description="Read the per-tensor records (bits, method, axis) that onnxq "
        "writes into a quantized model's metadata.",
    )
    i.add_argument("model")

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
    a.add_argument("--max-batches", type=_positive, default=16)
    a.add_argument(
        "--fused",
        action="store_true",
        help="run the quantized model with onnxruntime's int8 fusion (default: off)",
    )
    a.add_argument(
        "--top", type=_positive, default=15, help="print the N worst tensors (default 15)"
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
        type=_positive,
        metavar="MB",
        help="activation memory per batch (default 4096, as calibration's); above it the "
        "tensors are compared in several passes",
    )

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
    _selection_flags(e)
    _target_flags(e)
    _precision_flags(e)

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
    t.add_argument("--runs", type=_positive, default=60, help="timed runs per model (default 60)")
    return p


Flags = argparse._ActionsContainer  # a parser or one of its argument groups


def _selection_flags(parser: Flags) -> None:
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


def _target_flags(parser: Flags) -> None:
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


def _precision_flags(parser: Flags, placement: Flags | None = None) -> None:
    """--precision, --dynamic and (in ``placement``, else ``parser``) --dynamic-weight-scales
    (docs/precisions.md)."""
    from onnxq.config.options import DYNAMIC_WEIGHT_SCALES
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
    (placement or parser).add_argument(
        "--dynamic-weight-scales",
        choices=list(DYNAMIC_WEIGHT_SCALES),
        help="with --dynamic: one scale per weight where that keeps its SQNR >= 30 dB, else "
        "one per output column (auto, default; onnxruntime runs one scale faster on few rows, "
        "as in a one-token generation step), one per column everywhere (channel: most "
        "accurate) or one per weight everywhere (tensor: fastest)",
    )


def _weight_only_flags(q: Flags, weightonly: Flags) -> None:
    """--weights, and (in ``weightonly``) --block-size, --algorithm: weight-only quantization
    (docs/weight-only.md)."""
    from onnxq.config.choices import WEIGHT_ALGORITHMS, WEIGHT_ONLY

    q.add_argument(
        "--weights",
        choices=WEIGHT_ONLY,
        help="weight-only quantization: MatMul/Gemm weights (and embedding tables where the "
        "backend runs them) to int4 blocks or int8, activations stay float; --calib optional "
        "(docs/weight-only.md)",
    )
    weightonly.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help="with --weights: input rows sharing a scale (default 128 for int4, per channel "
        "for int8; 0: per channel; onnxruntime: a power of two >= 16, tensorrt: 64 or 128)",
    )
    weightonly.add_argument(
        "--algorithm",
        choices=WEIGHT_ALGORITHMS,
        help="with --weights: rtn (round to nearest, clip search; no data needed), gptq, awq, "
        "awq+gptq (these need --calib); auto: awq+gptq with data, else rtn",
    )


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def selections(args: argparse.Namespace) -> dict[str, Any]:
    """The selection flags as QuantConfig options (None: the config's)."""
    return {
        "exclude_op_types": tuple(args.exclude_op_type) if args.exclude_op_type else None,
        "exclude_modules": tuple(args.exclude_module) if args.exclude_module else None,
    }
