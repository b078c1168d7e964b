"""``onnxq``: quantize ONNX models to INT8 Q/DQ, check them against a backend, explain placement.

Exit codes: 0 success; 1 a check found violations; 2 a user error (one line on stderr, no
traceback, nothing written).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxq.config import BACKENDS
from onnxq.errors import BackendConstraintError, OnnxqError

EPILOG = """\
calibration data (--calib):
  a folder of .npz files, one batch per file, keys = model input names (file-name order);
  a folder of .npy files (single-input models); one .npz whose arrays share a leading
  sample axis (cut into --batch-size batches); or a folder of images (jpg/png/bmp/webp)
  with --preprocess (imagenet | 0-1 | tf | a spec, see docs/calibration.md).

examples:
  onnxq quantize model.onnx -o model.int8.onnx --calib calib/
  onnxq quantize model.onnx -o out.onnx --calib calib/ --backend onnxruntime --report r.json
  onnxq check model.int8.onnx --backend tensorrt
  onnxq explain model.onnx --backend tensorrt

exit codes: 0 ok, 1 check found violations (or quantize's output would break the backend's
constraints: nothing written, an onnxq bug), 2 user error (bad input, options or data).
"""


def _parser() -> argparse.ArgumentParser:
    from onnxq import __version__
    from onnxq.observers import METHODS

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
    q.add_argument("--config", metavar="FILE.yaml", help="QuantConfig YAML (see docs/config.md)")
    q.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        default=None,
        help="node-name glob that stays float (repeatable)",
    )
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
    _recovery_flags(q)
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
        description="Run the float and the quantized model on calibration data "
        "and report, per tensor in graph order, cosine similarity and relative "
        "error: the first layer where the error jumps is the one to exclude.",
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

    e = sub.add_parser(
        "explain",
        help="per op: quantized (which rule) or why not",
        description="Show where onnxq would place Q/DQ and why each op stays "
        "float, without calibrating. Rules that read the calibration data "
        "(mask_threshold, concat_range_ratio, weak_channel_fraction, "
        "weak_position_fraction) can keep "
        "more ops float in `onnxq quantize`; its report gives those reasons.",
    )
    e.add_argument("model")
    e.add_argument(
        "--backend", choices=BACKENDS, help="target backend (default: the config's, else tensorrt)"
    )
    e.add_argument("--config", metavar="FILE.yaml")
    e.add_argument("--exclude", action="append", metavar="GLOB", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxq`` console script."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.command == "quantize":
            return _quantize(args)
        if args.command == "check":
            return _check(args)
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "analyze":
            return _analyze(args)
        return _explain(args)
    except OnnxqError as exc:
        print(f"onnxq: error: {' '.join(str(exc).split())}", file=sys.stderr)
        # an output that breaks named backend constraints is onnxq's fault, not the user's
        return 1 if isinstance(exc, BackendConstraintError) and exc.violations else 2
    except KeyboardInterrupt:
        print("onnxq: interrupted; nothing was written", file=sys.stderr)
        return 130


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _quantize(args: argparse.Namespace) -> int:
    from onnxq.api import check_paths, quantize
    from onnxq.errors import OutputError

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
        preprocess=args.preprocess,
        save_calibration=args.save_calibration,
        load_calibration=args.load_calibration,
        **_recovery_options(args),
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
        for warning in result.report.warnings:
            print(f"onnxq: warning: {warning}", file=sys.stderr)
    return 0


def _recovery_flags(q: argparse.ArgumentParser) -> None:
    """The accuracy-recovery options of ``quantize`` (docs/accuracy.md)."""
    from onnxq.recover.options import CALIBRATION_MODES
    from onnxq.recover.smoothquant import DEFAULT_ALPHA

    r = q.add_argument_group("accuracy recovery (docs/accuracy.md)")
    r.add_argument(
        "--cle",
        action="store_true",
        help="cross-layer equalization of Conv -> [Relu] -> Conv pairs (exact float rewrite)",
    )
    r.add_argument(
        "--smoothquant",
        type=float,
        nargs="?",
        const=DEFAULT_ALPHA,
        metavar="ALPHA",
        help="migrate MatMul/Gemm input outliers into the weights with strength ALPHA in "
        f"(0, 1] (default {DEFAULT_ALPHA}; exact float rewrite)",
    )
    r.add_argument(
        "--calibration-mode",
        choices=CALIBRATION_MODES,
        help="float: ranges from the float model (default); prefix: measured again with "
        "every earlier layer quantized (two more passes)",
    )
    r.add_argument(
        "--adaround",
        action="store_true",
        help="learn each Conv/Gemm/MatMul weight's rounding from its layer's inputs and "
        "outputs on the calibration data",
    )
    r.add_argument(
        "--adaround-steps", type=int, metavar="N", help="AdaRound steps per layer (default 500)"
    )
    r.add_argument(
        "--bias-correction",
        action="store_true",
        help="subtract each layer's mean output shift from weight rounding from its bias",
    )


def _recovery_options(args: argparse.Namespace) -> dict[str, Any]:
    """QuantConfig fields the recovery flags set (None: not given, the config decides)."""
    return {
        "cle": True if args.cle else None,
        "smoothquant": args.smoothquant,
        "calibration_mode": args.calibration_mode,
        "adaround": True if args.adaround else None,
        "adaround_steps": args.adaround_steps,
        "bias_correction": True if args.bias_correction else None,
    }


def _with_method_overrides(config: str | None, items: list[str]) -> Any:
    """The config (path or None) with ``--method-for GLOB=METHOD`` overrides appended."""
    if not items:
        return config
    from onnxq.config import Override, QuantConfig
    from onnxq.errors import ConfigError

    base = QuantConfig.from_yaml(config) if config else QuantConfig()
    extra = []
    for item in items:
        pattern, sep, method = item.rpartition("=")
        if not sep or not pattern or not method:
            raise ConfigError(f"--method-for {item!r}: expected GLOB=METHOD")
        try:
            extra += [
                Override(node=pattern, method=method),
                Override(tensor=pattern, method=method),
            ]
        except ConfigError as exc:
            raise ConfigError(
                f"--method-for {item!r}: {str(exc).removeprefix('overrides[].method: ')}"
            ) from None
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
    qdq = sum(n.op_type in ir.QDQ_OPS for n in model.graph.node)
    print(f"{args.model}: {len(violations)} {profile.name} violation(s), {qdq} Q/DQ nodes")
    integer = Counter(n.op_type for n in model.graph.node if ir.is_integer_op(n.op_type))
    if qdq == 0 and integer:
        found = ", ".join(f"{op} x{k}" for op, k in sorted(integer.items()))
        print(
            f"note: the model is quantized in onnxruntime's operator format ({found}), not with "
            "Q/DQ nodes: onnxq checks Q/DQ models, and TensorRT reads only those; quantize the "
            "float original with onnxq quantize"
        )
    elif qdq == 0:
        print(
            "note: the model has no Q/DQ nodes, so there was nothing to check; quantize it "
            "first (onnxq quantize)"
        )
    if profile.fused_validation and qdq:  # the backend runs fused integer kernels: which fused
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
    if args.engine:
        from onnxq.backends.tensorrt import build_engine

        print(build_engine(args.model, shapes).summary())
    return 1 if violations else 0


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
    from onnxq.analyze import analyze, write_analysis
    from onnxq.api import check_paths
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
    if not any(n.op_type in ir.QDQ_OPS for n in quant_model.graph.node):
        swapped = any(n.op_type in ir.QDQ_OPS for n in float_model.graph.node)
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
    layers = analyze(float_model, quant_model, data, args.max_batches, args.fused)
    if args.report:
        write_analysis(args.report, layers)
    worst = sorted(layers, key=lambda x: (x.cosine, x.tensor))[: args.top]
    print(f"{len(layers)} tensors compared; the {len(worst)} least faithful:")
    for x in worst:
        odd = (
            f"  ({x.nonfinite_mismatches} values NaN/Inf in one model only)"
            if x.nonfinite_mismatches
            else ""
        )
        print(f"  cos {x.cosine:.6f}  rel {x.relative_error:8.4g}  {x.op_type:<18} {x.tensor}{odd}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import onnx

    from onnxq.errors import ModelLoadError
    from onnxq.materialize import read_metadata

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
    print(f"{'tensor':<{width}}  kind        bits  method              axis  symmetric")
    for name, r in records.items():
        print(
            f"{name:<{width}}  {r.get('kind', ''):<10}  {r.get('bits', ''):>4}  "
            f"{r.get('method', '')!s:<18}  {r.get('axis')!s:>4}  {r.get('symmetric')}"
        )
    print(f"{len(records)} quantized tensors")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from onnxq import ir
    from onnxq.annotate import annotate
    from onnxq.api import refuse_quantized, resolve_config
    from onnxq.backends.profile import PROFILES
    from onnxq.errors import UnsupportedModelError
    from onnxq.rewrites.simplify import simplify

    cfg = resolve_config(
        args.config, backend=args.backend, exclude=tuple(args.exclude) if args.exclude else None
    )
    profile = PROFILES[cfg.backend]
    loaded = ir.load_model(args.model, profile.min_opset)
    try:
        refuse_quantized(loaded, Path(args.model), profile)
    except UnsupportedModelError as exc:  # explain what is there, but say quantize refuses
        print(f"onnxq: warning: `onnxq quantize` refuses this model: {exc}", file=sys.stderr)
    model, _ = simplify(loaded)
    ann = annotate(ir.Graph(model), profile, cfg)
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
        "LayerNormalization; the quantize report lists them)"
    )
    for note in ann.notes:
        print(f"note: {note}")
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
