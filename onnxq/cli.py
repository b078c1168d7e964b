"""``onnxq``: quantize ONNX models to INT8 Q/DQ, check them against a backend, explain placement.

Exit codes (:data:`EXIT_CODES`): 0 success; 1 a check found violations, or an accuracy target
was missed; 2 a user error (one line on stderr, no traceback, nothing written); 3 an internal
error, a bug in onnxq (the traceback, then one line asking for a report); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxq.backends.profile import BACKENDS
from onnxq.errors import (
    REPORT_REQUEST,
    AccuracyError,
    BackendConstraintError,
    InternalError,
    OnnxqError,
)
from onnxq.options import TARGET_COSTS

EXIT_OK = 0
EXIT_FAILED = 1  # the run worked and its result falls short: violations, a missed target
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130
# what the CLI exits with for each kind of error (the first class that matches)
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (AccuracyError, EXIT_FAILED),
    (OnnxqError, EXIT_USER_ERROR),
    (InternalError, EXIT_INTERNAL_ERROR),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
    (Exception, EXIT_INTERNAL_ERROR),  # any other exception is a bug in onnxq too
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


def _parser() -> argparse.ArgumentParser:
    from onnxq.observers import METHODS
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
        description="Quantize a float ONNX model to INT8 Q/DQ.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    q.add_argument(
        "--method-for",
        action="append",
        default=[],
        metavar="GLOB=METHOD",
        help="per-tensor method: tensors whose name, or whose reading node's name, "
        "matches GLOB use METHOD (repeatable; later wins)",
    )
    q.add_argument(
        "--percentile", type=float, help="percentile kept by --method percentile (default 99.99)"
    )
    _precision_flags(q)
    q.add_argument("--config", metavar="FILE.yaml", help="QuantConfig YAML (see docs/config.md)")
    q.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        default=None,
        help="node-name glob that stays float (repeatable); a name that matches no node "
        "but a tensor (as `onnxq analyze` lists them) keeps the tensor's producer float",
    )
    _selection_flags(q)
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
    q.add_argument(
        "--memory-budget",
        type=int,
        metavar="MB",
        help="activation memory per batch during calibration (default 4096); "
        "above it tensors are observed in several passes",
    )
    q.add_argument(
        "--histogram-sample",
        type=int,
        metavar="N",
        help="values per sample that enter a histogram (default 65536; larger "
        "samples contribute every s-th value; 0 = every value, slower)",
    )
    q.add_argument(
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
    q.add_argument(
        "--heldout",
        metavar="DATA",
        help="data to measure --target on (default: the first --heldout-batches calibration "
        "batches, which calibration then skips)",
    )
    q.add_argument(
        "--heldout-batches",
        type=_positive,
        help="batches held out for --target (default 16)",
    )
    q.add_argument(
        "--target-cost",
        choices=TARGET_COSTS,
        help="what --target's search keeps small: layers (the fewest float layers, default) or "
        "macs (the fewest multiply-adds left out of INT8, by gain per multiply-add)",
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
    _target_flags(q)
    _weight_only_flags(q)
    from onnxq.recover.flags import add_recovery_flags

    add_recovery_flags(q)
    q.add_argument("--no-simplify", action="store_true", help="skip the simplify passes")
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


def _selection_flags(parser: argparse.ArgumentParser) -> None:
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


def _selections(args: argparse.Namespace) -> dict[str, Any]:
    """The selection flags as QuantConfig options (None: the config's)."""
    return {
        "exclude_op_types": tuple(args.exclude_op_type) if args.exclude_op_type else None,
        "exclude_modules": tuple(args.exclude_module) if args.exclude_module else None,
    }


def _target_flags(parser: argparse.ArgumentParser) -> None:
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


def _precision_flags(parser: argparse.ArgumentParser) -> None:
    """--precision and --dynamic (docs/precisions.md)."""
    from onnxq.precisions import PRECISIONS

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
        help="dynamic quantization (--backend onnxruntime): int8 weights per channel, "
        "activations quantized at run time; no --calib needed (given, it feeds the fidelity "
        "check)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxq`` console script."""
    args = _parser().parse_args(argv)
    # Ctrl-C and SIGTERM become KeyboardInterrupt, held off while a scratch folder is made or
    # removed (onnxq.ir.scratch): an interrupted run leaves nothing behind
    from onnxq.ir.scratch import interrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        if args.command == "quantize":
            return _quantize(args)
        if args.command == "check":
            return _check(args)
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "analyze":
            return _analyze(args)
        if args.command == "tune-cpu":
            return _tune_cpu(args)
        return _explain(args)
    except OnnxqError as exc:
        print(f"onnxq: error: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("onnxq: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # a reader that stopped early (`onnxq explain M | head`)
        raise
    except Exception as exc:  # InternalError, or any other bug: the traceback helps the report
        traceback.print_exc(file=sys.stderr)
        what = (
            one_line(exc)
            if isinstance(exc, InternalError)
            else (f"{type(exc).__name__}: {one_line(exc)}; {REPORT_REQUEST}")
        )
        print(f"onnxq: internal error: {what}", file=sys.stderr)
        return exit_code(exc)


def exit_code(exc: BaseException) -> int:
    """The exit code for ``exc`` (:data:`EXIT_CODES`): 1 for a backend constraint error that
    lists violations, as for a failed check."""
    if isinstance(exc, BackendConstraintError) and exc.violations:
        return EXIT_FAILED
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), EXIT_INTERNAL_ERROR)


def one_line(exc: BaseException) -> str:
    """``exc``'s message and the notes added to it (``add_note``), on one line."""
    text = "; ".join([str(exc), *getattr(exc, "__notes__", ())])
    return " ".join(text.split())


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _quantize(args: argparse.Namespace) -> int:
    from onnxq.api import check_paths, quantize
    from onnxq.errors import OutputError
    from onnxq.fidelity_messages import latency_warning
    from onnxq.recover.flags import recovery_options

    if not args.output or args.output.endswith(("/", "\\")) or Path(args.output).is_dir():
        raise OutputError(
            f"output {args.output!r} is not a file path; give e.g. -o model.int8.onnx"
        )
    out = Path(args.output)
    check_paths(
        {"output": out, "report": args.report, "calibration cache to save": args.save_calibration},
        {
            "input model": args.model,
            "config": args.config,
            "calibration cache to load": args.load_calibration,
            "calibration data": args.calib,
        },
    )
    for target in (out, Path(args.report) if args.report else None):
        if target is not None and not target.parent.is_dir():
            raise OutputError(f"output folder does not exist: {target.parent}")
    new_cache = args.save_calibration is not None and not Path(args.save_calibration).exists()
    result = quantize(
        args.model,
        args.calib,
        backend=args.backend,
        method=args.method,
        exclude=args.exclude,
        config=_with_method_overrides(args.config, args.method_for),
        batch_size=args.batch_size,
        percentile=args.percentile,
        max_batches=args.max_batches,
        simplify=False if args.no_simplify else None,
        progress=False if args.quiet else None,
        memory_budget_mb=args.memory_budget,
        histogram_sample=args.histogram_sample,
        histogram_budget=args.histogram_budget,
        target_cpu=args.target_cpu,
        cost_table=args.cost_table,
        preprocess=args.preprocess,
        precision=args.precision,
        dynamic=True if args.dynamic else None,
        weight_only=args.weights,
        block_size=args.block_size,
        weight_algorithm=args.algorithm,
        save_calibration=args.save_calibration,
        load_calibration=args.load_calibration,
        target_accuracy=args.target,
        heldout_batches=args.heldout_batches,
        target_cost=args.target_cost,
        heldout=args.heldout,
        device=args.device,
        executor=_ray_executor(args.ray, args.device),
        **_selections(args),
        **recovery_options(args),
    )
    try:
        written = result.save(
            out, report=args.report, external_data=True if args.external_data else None
        )
    except BaseException:  # an error or Ctrl-C: leave no file of this run behind
        if new_cache:
            Path(args.save_calibration).unlink(missing_ok=True)
        raise
    if args.save_calibration is not None:
        written.append(Path(args.save_calibration))
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


def _target_missed(record: dict[str, Any] | None, out: Path) -> None:
    """Raise :class:`AccuracyError` (exit 1) after the best model was written, when the
    accuracy target's search did not meet it."""
    if record is None or record["met"]:
        return
    raise AccuracyError(
        f"accuracy target {record['target']} not met on the held-out batches: the best model "
        f"found ({out}, {len(record['kept_float'])} layer(s) float) scores {record['score']} "
        f"(all INT8: {record['int8_score']}); lower the target or keep more layers float "
        "with --exclude"
    )


def _ray_executor(address: str | None, device: str | None) -> Any:
    """A Ray executor for ``--ray ADDRESS`` (None without it), each task on a GPU of its own
    with ``--device cuda``; Ray disconnects at exit."""
    if address is None:
        return None
    from onnxq.scale import RayExecutor

    return RayExecutor(address, num_gpus=1.0 if device and device != "cpu" else 0.0)


def _weight_only_flags(q: argparse.ArgumentParser) -> None:
    """--weights, --block-size, --algorithm: weight-only quantization (docs/weight-only.md)."""
    from onnxq.weightonly import WEIGHT_ALGORITHMS, WEIGHT_ONLY

    q.add_argument(
        "--weights",
        choices=WEIGHT_ONLY,
        help="weight-only quantization: MatMul/Gemm weights (and embedding tables where the "
        "backend runs them) to int4 blocks or int8, activations stay float; --calib optional "
        "(docs/weight-only.md)",
    )
    q.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help="with --weights: input rows sharing a scale (default 128 for int4, per channel "
        "for int8; 0: per channel; onnxruntime: a power of two >= 16, tensorrt: 64 or 128)",
    )
    q.add_argument(
        "--algorithm",
        choices=WEIGHT_ALGORITHMS,
        help="with --weights: rtn (round to nearest, clip search; no data needed), gptq, awq, "
        "awq+gptq (these need --calib); auto: awq+gptq with data, else rtn",
    )


def _with_method_overrides(config: str | None, items: list[str]) -> Any:
    """The config (path or None) with ``--method-for GLOB=METHOD`` overrides appended."""
    if not items:
        return config
    from onnxq.config import Override, QuantConfig
    from onnxq.errors import ConfigError
    from onnxq.overrides import check_method

    base = QuantConfig.from_yaml(config) if config else QuantConfig()
    extra = []
    for item in items:
        pattern, sep, method = item.rpartition("=")
        if not sep or not pattern or not method:
            raise ConfigError(f"--method-for {item!r}: expected GLOB=METHOD")
        check_method(method, f"--method-for {item!r}")
        extra += [Override(node=pattern, method=method), Override(tensor=pattern, method=method)]
    return base.replace(overrides=(*base.overrides, *extra))


def _check(args: argparse.Namespace) -> int:
    from collections import Counter

    from onnxq import ir
    from onnxq.backends.check import check
    from onnxq.backends.profile import PROFILES

    profile = PROFILES[args.backend]
    shapes = _shapes(args.shape)  # checked even without --engine: a typo is not ignored
    model = ir.load_model(args.model, min_opset=1)
    violations = check(model, profile)
    for v in violations:
        print(v)
    qdq = sum(n.op_type in ir.QDQ_OPS for n in ir.every_node(model.graph))  # bodies too
    weight_only = sum(n.op_type in ir.WEIGHT_ONLY_OPS for n in ir.every_node(model.graph))
    print(
        f"{args.model}: {len(violations)} {profile.name} violation(s), {qdq} Q/DQ nodes"
        + (f", {weight_only} weight-only ops" if weight_only else "")
    )
    integer = Counter(n.op_type for n in ir.every_node(model.graph) if ir.is_integer_op(n.op_type))
    if qdq == 0 and integer:
        found = ", ".join(f"{op} x{k}" for op, k in sorted(integer.items()))
        print(
            f"note: the model is quantized in onnxruntime's operator format ({found}), not with "
            "Q/DQ nodes: onnxq checks Q/DQ models, and TensorRT reads only those; quantize the "
            "float original with onnxq quantize"
        )
    elif qdq == 0 and not weight_only:
        print(_no_qdq_note(model, profile.name))
    activations = any(n.op_type == "QuantizeLinear" for n in ir.every_node(model.graph))
    if profile.fused_validation and activations:  # fused integer kernels: which fused
        from onnxq.backends.fusion import fusion_report

        fusion = fusion_report(model, profile.integer_kernel_ops, profile.folded_activations)
        kernels = ", ".join(f"{k} x{v}" for k, v in fusion.integer_ops.items()) or "none"
        print(
            f"onnxruntime fused {fusion.fused} of {len(fusion.candidates)} Q/DQ groups "
            f"({fusion.ratio:.0%}) into integer kernels: {kernels}"
        )
        for name, op in fusion.unfused:
            why = fusion.reasons.get(name)
            print(f"  not fused: {name} ({op})" + (f": {why}" if why else ""))
        if fusion.float_between:
            ops = sorted({op for _, op in fusion.float_between})
            print(
                f"{len(fusion.float_between)} float op(s) between quantized neighbours (no "
                f"integer kernel in onnxruntime): {', '.join(ops)}"
            )
        if fusion.float_inputs:
            ops = sorted({op for _, op in fusion.float_inputs})
            print(
                f"{len(fusion.float_inputs)} float op(s) read a float input beside a "
                f"DequantizeLinear (not Q/DQ groups; their output is quantized for a later "
                f"reader): {', '.join(ops)}"
            )
    if profile.cpu_tuned and qdq:
        from onnxq.backends.cpu import this_machine
        from onnxq.backends.target import target_mismatch
        from onnxq.materialize import read_target_cpu

        mismatch = target_mismatch(read_target_cpu(model), this_machine().name)
        if mismatch:
            print(f"note: {mismatch}")
    if args.engine:
        from onnxq.backends.tensorrt import build_engine

        print(build_engine(args.model, shapes).summary())
    return 1 if violations else 0


def _no_qdq_note(model: Any, backend: str) -> str:
    """What a model without Q/DQ nodes means: onnxq's own output where INT8 paid for no op (its
    metadata says onnxq wrote it), or a float model to quantize first."""
    from onnxq.materialize import read_metadata

    if read_metadata(model) is None:
        return (
            "note: the model has no Q/DQ nodes, so there was nothing to check; quantize it "
            "first (onnxq quantize)"
        )
    return (
        "note: onnxq quantized this model (its metadata says so) and placed no Q/DQ: INT8 "
        "paid for none of its ops on the backend it was quantized for, so it computes what "
        "the float model does; the quantize report (--report) gives each op's reason, and "
        f"`onnxq explain FLOAT.onnx --backend {backend}` shows them for the float model"
    )


def _shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    from onnxq.errors import ConfigError

    out = {}
    for item in items:
        name, _, dims = item.rpartition("=")
        try:
            out[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--shape {item!r}: expected NAME=1x3x224x224") from None
        if not name:
            raise ConfigError(f"--shape {item!r}: expected NAME=1x3x224x224")
    return out


def _analyze(args: argparse.Namespace) -> int:
    from onnxq import ir
    from onnxq.analyze import analyze, print_analysis, write_analysis
    from onnxq.api import check_paths
    from onnxq.calibrate import DEFAULT_MEMORY_BUDGET
    from onnxq.data import model_inputs, open_source

    check_paths(
        {"report": args.report},
        {
            "float model": args.float_model,
            "quantized model": args.quant_model,
            "calibration data": args.calib,
        },
    )
    float_model = ir.load_model(args.float_model)
    quant_model = ir.load_model(args.quant_model)
    if not any(n.op_type in ir.QDQ_OPS for n in ir.every_node(quant_model.graph)):
        swapped = any(n.op_type in ir.QDQ_OPS for n in ir.every_node(float_model.graph))
        print(
            f"onnxq: warning: {args.quant_model} holds no Q/DQ nodes"
            + (
                ", and the first model does: are the two swapped? (onnxq analyze FLOAT QUANT)"
                if swapped
                else ": it computes what a float model does"
            ),
            file=sys.stderr,
        )
    data = open_source(args.calib, model_inputs(ir.Graph(float_model)), 1, args.preprocess)
    budget = (args.memory_budget or DEFAULT_MEMORY_BUDGET // 2**20) * 2**20
    layers = analyze(float_model, quant_model, data, args.max_batches, args.fused, budget)
    if args.report and Path(args.report).suffix.lower() in (".html", ".htm"):
        from dataclasses import asdict

        from onnxq.analyze_html import analysis_page

        again = open_source(args.calib, model_inputs(ir.Graph(float_model)), 1, args.preprocess)
        title = f"onnxq analyze: {Path(args.float_model).name} vs {Path(args.quant_model).name}"
        text = analysis_page(
            [asdict(x) for x in layers], float_model, quant_model, again, args.max_batches, title
        )
        ir.atomic_write_bytes(Path(args.report), text.encode("utf-8"))
    elif args.report:
        write_analysis(args.report, layers)
    outputs = [o.name for o in float_model.graph.output]
    print_analysis(layers, outputs, args.top)
    if args.sensitivity:
        _print_sensitivity(args)
    return 0


def _print_sensitivity(args: argparse.Namespace) -> None:
    """The layers of the float model ranked by sensitivity (``analyze --sensitivity``)."""
    from onnxq.config import QuantConfig
    from onnxq.mixed_precision import sensitivity_ranking

    cfg = QuantConfig(backend=args.sensitivity, preprocess=args.preprocess, progress=True)
    held, base, ranking = sensitivity_ranking(args.float_model, args.calib, cfg)
    print(
        f"sensitivity ({args.sensitivity}, on {held.source}): all INT8 cosine {base:.6f}; "
        f"the {min(args.top, len(ranking))} layers whose float alone gains most:"
    )
    for s in ranking[: args.top]:
        macs = "?" if s.macs is None else f"{s.macs:,}"
        print(f"  +{s.gain:.6f}  cos {s.alone:.6f}  {macs:>14} MACs  {s.op_type:<8} {s.node}")


def _inspect(args: argparse.Namespace) -> int:
    import onnx

    from onnxq.errors import ModelLoadError
    from onnxq.materialize import read_metadata, read_target_cpu

    path = Path(args.model)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        raise ModelLoadError(f"{path}: not a readable ONNX file") from None
    records = read_metadata(model)
    if records is None:
        raise ModelLoadError(f"{path}: no onnxq quantization metadata (not made by onnxq?)")
    width = max([len("tensor"), *(len(t) for t in records)])
    print(
        f"{'tensor':<{width}}  kind        bits  dtype         method              axis  symmetric"
    )
    for name, r in records.items():
        kind = f"{r.get('kind', '')}{'*' if r.get('runtime') else ''}"
        print(
            f"{name:<{width}}  {kind:<10}  {r.get('bits', ''):>4}  {r.get('dtype', 'int8')!s:<12}  "
            f"{r.get('method', '')!s:<18}  {r.get('axis')!s:>4}  {r.get('symmetric')}"
        )
    dtypes = sorted({str(r.get("dtype", "int8")) for r in records.values()})
    print(f"{len(records)} quantized tensors ({', '.join(dtypes)})")
    target = read_target_cpu(model)
    if target is not None:
        print(f"tuned for CPU class {target} (onnxruntime)")
    if any(r.get("runtime") for r in records.values()):
        print("* quantized at run time by onnxruntime's dynamic kernels (dynamic quantization)")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from onnxq import ir
    from onnxq.api import resolve_config
    from onnxq.backends.target import profile_for
    from onnxq.errors import UnsupportedModelError
    from onnxq.place.engine import annotate
    from onnxq.place.facts import GraphFacts
    from onnxq.prepare import refuse_quantized
    from onnxq.rewrites.simplify import simplify

    cfg = resolve_config(
        args.config,
        backend=args.backend,
        exclude=tuple(args.exclude) if args.exclude else None,
        target_cpu=args.target_cpu,
        cost_table=args.cost_table,
        precision=args.precision,
        dynamic=True if args.dynamic else None,
        **_selections(args),
    )
    profile, _ = profile_for(cfg.target)
    loaded = ir.load_model(args.model, profile.min_opset)
    try:
        refuse_quantized(loaded, Path(args.model), profile)
    except UnsupportedModelError as exc:  # explain what is there, but say quantize refuses
        print(f"onnxq: warning: `onnxq quantize` refuses this model: {exc}", file=sys.stderr)
    model, _ = simplify(loaded)
    ann = annotate(GraphFacts.of(ir.Graph(model), profile), profile, cfg.placement)
    width = max((len(d.node) for d in ann.decisions), default=10)
    for d in ann.decisions:
        if d.quantized:
            what = f"quantized by {d.rule}: " + ", ".join(d.tensors) if d.tensors else d.reason
        else:
            what = f"float: {d.reason}" + (f" [closest rule: {d.rule}]" if d.rule else "")
        print(f"{d.node:<{width}}  {d.op_type:<18} {what}")
    n_q = sum(d.quantized for d in ann.decisions)
    print(
        f"{n_q} of {len(ann.decisions)} ops quantized for {profile.name} (before calibration: "
        "what the data shows can keep more of them float, e.g. a range >= mask_threshold, "
        "Concat inputs whose ranges differ, weak channels, quiet frames before a "
        "LayerNormalization, If branches or Loop bodies the data never runs; the quantize "
        "report lists them)"
    )
    for note in ann.notes:
        print(f"note: {note}")
    return 0


def _tune_cpu(args: argparse.Namespace) -> int:
    from onnxq.backends.tune import tune_cost_table
    from onnxq.errors import OutputError
    from onnxq.ir import atomic_write_bytes

    out = Path(args.output)
    if not out.parent.is_dir():
        raise OutputError(f"output folder does not exist: {out.parent}")
    table = tune_cost_table(args.runs)
    atomic_write_bytes(out, table.to_json().encode("utf-8"))
    print(table.to_json(), end="")
    print(f"wrote {out}; use it with: onnxq quantize ... --backend onnxruntime --cost-table {out}")
    return 0


def main_exit() -> None:
    """Console-script wrapper: exit with :func:`main`'s code; output piped into a reader that
    stops early (``onnxq explain M | head``) ends quietly, as other command-line tools do."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        code = 141  # 128 + SIGPIPE, what a shell reports for such a writer
    sys.exit(code)


if __name__ == "__main__":
    main_exit()
