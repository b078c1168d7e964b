"""``onnxq quantize``: the command-line options turned into one :func:`onnxq.quantize` call, and
what it prints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from onnxq.cli.parser import selections
from onnxq.errors import AccuracyError


def quantize_command(args: argparse.Namespace) -> int:
    from onnxq.api import check_paths, quantize
    from onnxq.errors import OutputError
    from onnxq.report.fidelity import latency_warning

    if not args.output or args.output.endswith(("/", "\\")) or Path(args.output).is_dir():
        raise OutputError(
            f"output {args.output!r} is not a file path; give e.g. -o model.int8.onnx"
        )
    out = Path(args.output)
    options = with_settings(_flag_fields(args), args.set)
    save, load = _path_of(options, "save_calibration"), _path_of(options, "load_calibration")
    check_paths(
        {"output": out, "report": args.report, "calibration cache to save": save},
        {
            "input model": args.model,
            "config": args.config,
            "calibration cache to load": load,
            "calibration data": args.calib,
        },
    )
    for target in (out, Path(args.report) if args.report else None):
        if target is not None and not target.parent.is_dir():
            raise OutputError(f"output folder does not exist: {target.parent}")
    new_cache = Path(save) if save is not None and not Path(save).exists() else None
    config = _with_method_overrides(args.config, args.method_for)
    result = quantize(
        args.model,
        args.calib,
        config,
        target=_heldout_target(args.heldout, config, options),
        executor=_ray_executor(args.ray, args.device),
        **options,
    )
    try:
        written = result.save(
            out, report=args.report, external_data=True if args.external_data else None
        )
    except BaseException:  # an error or Ctrl-C: leave no file of this run behind
        if new_cache is not None:
            new_cache.unlink(missing_ok=True)
        raise
    if save is not None:
        written.append(Path(save))
    if not args.quiet:
        print(result.report.summary())
        print("wrote " + ", ".join(str(w) for w in written))
    else:  # the summary ends with them; without it they must still reach the user
        view = result.report.default_session
        slower = latency_warning(view.cpu, view.latency) if view is not None else None
        for warning in [*result.report.warnings, *([slower] if slower else [])]:
            print(f"onnxq: warning: {warning}", file=sys.stderr)
    _target_missed(result.report.mixed_precision, out)
    return 0


def _flag_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The QuantConfig fields the flags set (None: not given, the config decides)."""
    from onnxq.cli.recovery import recovery_options

    return {
        "backend": args.backend,
        "method": args.method,
        "exclude": args.exclude,
        "percentile": args.percentile,
        "max_batches": args.max_batches,
        "batch_size": args.batch_size,
        "save_calibration": args.save_calibration,
        "load_calibration": args.load_calibration,
        "simplify": False if args.no_simplify else None,
        "progress": False if args.quiet else None,
        "memory_budget_mb": args.memory_budget,
        "target_cpu": args.target_cpu,
        "cost_table": args.cost_table,
        "preprocess": args.preprocess,
        "precision": args.precision,
        "high_precision": args.high_precision,
        "dynamic": True if args.dynamic else None,
        "dynamic_weight_scales": args.dynamic_weight_scales,
        "weight_only": args.weights,
        "block_size": args.block_size,
        "weight_algorithm": args.algorithm,
        "target_accuracy": args.target,
        "target_cost": args.target_cost,
        "target_max_float_macs": args.target_max_float_macs,
        "device": args.device,
        **selections(args),
        **recovery_options(args),
    }


def _heldout_target(heldout: str | None, config: Any, options: dict[str, Any]) -> Any:
    """The accuracy target that ``--heldout DATA`` is measured on: ``--target``, else the
    config's ``target_accuracy``, with ``heldout`` its data (None without ``--heldout``: the
    config's target, if any, is measured on held-out calibration batches)."""
    if heldout is None:
        return None
    from onnxq.config.recipes import weight_only_refusal
    from onnxq.config.resolve import run_config
    from onnxq.errors import ConfigError
    from onnxq.numerics.accuracy_target import AccuracyTarget, parse_target

    cfg = run_config(config, options)
    width = cfg.weightonly.weight_only
    if width is not None:  # a weight-only run has no target to measure
        raise ConfigError(weight_only_refusal("heldout", width))
    text = cfg.accuracy.target_accuracy
    if text is None:
        raise ConfigError(
            "--heldout DATA is the data --target is measured on: add --target METRIC=VALUE"
        )
    goal = parse_target(text, "--target" if options.get("target_accuracy") else "target_accuracy")
    return AccuracyTarget(goal.metric, goal.threshold, heldout=heldout)


def _path_of(options: dict[str, Any], name: str) -> str | None:
    """The file a path field of ``options`` names (a flag's or ``--set``'s; None: not given,
    or not a path, which the config then refuses)."""
    value = options.get(name)
    return value if isinstance(value, str) else None


def with_settings(fields: dict[str, Any], settings: list[str]) -> dict[str, Any]:
    """``fields`` (from the flags) with each ``--set SECTION.FIELD=VALUE`` applied; a field
    that a flag and ``--set`` give different values is a :class:`ConfigError`."""
    from onnxq.config.sections import parse_setting
    from onnxq.errors import ConfigError

    out = dict(fields)
    given: dict[str, str] = {}
    for text in settings:
        name, value = parse_setting(text)
        if name in given:
            raise ConfigError(f"--set {text!r}: {name} is already set by --set {given[name]!r}")
        if out.get(name) is not None and out[name] != value:
            raise ConfigError(
                f"--set {text!r}: a flag already sets {name} to {out[name]!r}; give it once"
            )
        out[name], given[name] = value, text
    return out


def _target_missed(record: dict[str, Any] | None, out: Path) -> None:
    """Raise :class:`AccuracyError` (exit 1) after the best model was written, when the
    accuracy target's search did not meet it."""
    if record is None or record["met"]:
        return
    raise AccuracyError(
        f"accuracy target {record['target']} not met on the held-out batches: the best model "
        f"found ({out}, {len(record['kept_float'])} layer(s) float) scores {record['score']} "
        f"(all INT8: {record['int8_score']}); lower the target or "
        + (
            "raise --target-max-float-macs"
            if record.get("max_float_macs_fraction") is not None
            else "keep more layers float with --exclude"
        )
    )


def _ray_executor(address: str | None, device: str | None) -> Any:
    """A Ray executor for ``--ray ADDRESS`` (None without it), each task on a GPU of its own
    with ``--device cuda``; Ray disconnects at exit."""
    if address is None:
        return None
    from onnxq.scale import RayExecutor

    return RayExecutor(address, num_gpus=1.0 if device and device != "cpu" else 0.0)


def _with_method_overrides(config: str | None, items: list[str]) -> Any:
    """The config (path or None) with ``--method-for GLOB=METHOD`` overrides appended."""
    if not items:
        return config
    from onnxq.config import Override, QuantConfig
    from onnxq.config.overrides import check_method
    from onnxq.errors import ConfigError

    base = QuantConfig.from_yaml(config) if config else QuantConfig()
    extra = []
    for item in items:
        pattern, sep, method = item.rpartition("=")
        if not sep or not pattern or not method:
            raise ConfigError(f"--method-for {item!r}: expected GLOB=METHOD")
        check_method(method, f"--method-for {item!r}")
        extra += [Override(node=pattern, method=method), Override(tensor=pattern, method=method)]
    return base.replace(overrides=(*base.overrides, *extra))
