"""``onnxq quantize``'s flags: the first-level options ``--help`` shows, and the others grouped
by config section under ``--help-all`` (:mod:`onnxq.config.sections`)."""

from __future__ import annotations

import argparse
from typing import Any

from onnxq.backends.profile import BACKENDS
from onnxq.cli.flags import EPILOG, Flags, precision_flags, selection_flags, target_flags
from onnxq.config.options import TARGET_COSTS
from onnxq.config.sections import SECTIONS

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
        "high_precision",
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
    flag_of: dict[str, str] = {}
    for action in parser._actions:
        if action.option_strings:
            flag_of.setdefault(action.dest, flag_name(action))
    lines = ["config fields (--set SECTION.FIELD=VALUE; a YAML file may nest them the same way):"]
    for section, (what, names) in SECTIONS.items():
        lines.append(f"  {section}: {what}")
        for name in names:
            flag = _FLAG_OF_FIELD.get(name) or flag_of.get(name)
            also = f"  ({flag})" if flag else ""
            lines.append(f"    {section}.{name}={defaults[name]!r}{also}")
    return "\n".join(lines) + "\n"


def flag_name(action: argparse.Action) -> str:
    """The name of an option as the help names it: its long form, ``--cle`` rather than
    ``--no-cle`` for an on/off pair."""
    longs = [s for s in action.option_strings if s.startswith("--")] or action.option_strings
    return next((s for s in longs if not s.startswith("--no-")), longs[0])


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
    "overrides": "--method-for",
}


def add_quantize(sub: Any) -> None:
    """The ``quantize`` subcommand of ``sub`` (the parser's subparsers)."""
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
    # the second-level options, one group per config section (shown by --help-all)
    sec = {name: q.add_argument_group(f"{name}: {what}") for name, (what, _) in SECTIONS.items()}
    _input_flags(q, sec)
    _data_flags(q, sec)
    _accuracy_flags(q, sec)
    _run_flags(q, sec)


Groups = dict[str, Any]  # config section -> its argument group


def _input_flags(q: Flags, sec: Groups) -> None:
    """The model, output, data, backend, method, precision, config and selection flags."""
    from onnxq.numerics.observers import METHODS

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
    precision_flags(q, sec["placement"])
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
    selection_flags(sec["placement"])


def _data_flags(q: Flags, sec: Groups) -> None:
    """The report, how the calibration data is read and observed, the calibration cache."""
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


def _accuracy_flags(q: Flags, sec: Groups) -> None:
    """--target and its search's options."""
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
        help="data to measure --target on (default: the first accuracy.heldout_batches "
        "calibration batches, which calibration then skips)",
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


def _run_flags(q: Flags, sec: Groups) -> None:
    """Where the run goes (Ray, device), the CPU tuning, weight-only, recovery and the output."""
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
    target_flags(sec["profile"])
    _weight_only_flags(q, sec["weightonly"])
    from onnxq.cli.recovery import add_recovery_flags

    add_recovery_flags(sec["recovery"], sec["placement"])
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


def _weight_only_flags(q: Flags, weightonly: Flags) -> None:
    """--weights, and (in ``weightonly``) --block-size, --algorithm: weight-only quantization
    (docs/weight-only.md)."""
    from onnxq.config.weightonly import WEIGHT_ALGORITHMS, WEIGHT_ONLY

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
