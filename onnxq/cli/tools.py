"""``onnxq check``, ``analyze``, ``inspect``, ``explain`` and ``tune-cpu``: the commands that read a
model and print what they find."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxq.cli.parser import selections

if TYPE_CHECKING:
    from onnxq.backends.profile import BackendProfile
    from onnxq.config import QuantConfig
    from onnxq.config.recipes import ActivationRecipe
    from onnxq.place.facts import GraphFacts


def check_command(args: argparse.Namespace) -> int:
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
        from onnxq.materialize.qdq import read_target_cpu

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
    from onnxq.backends.profile import PROFILES
    from onnxq.materialize.qdq import read_metadata

    typed = PROFILES[backend].strong_typing  # its typing rules ran all the same
    checked = (
        "there was nothing to check but its typing (TensorRT 11's strong typing rules)"
        if typed
        else "there was nothing to check"
    )
    if read_metadata(model) is None:
        return (
            f"note: the model has no Q/DQ nodes, so {checked}; quantize it first (onnxq quantize)"
        )
    return (
        "note: onnxq quantized this model (its metadata says so) and placed no Q/DQ: INT8 "
        "paid for none of its ops on the backend it was quantized for, so it computes what "
        "the float model does"
        + (" (in the precisions its types say)" if typed else "")
        + "; the quantize report (--report) gives each op's reason, and "
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


def analyze_command(args: argparse.Namespace) -> int:
    from onnxq import ir
    from onnxq.analyze.compare import analyze, print_analysis, quantized_in_bodies, write_analysis
    from onnxq.api import check_paths
    from onnxq.calibrate.engine import DEFAULT_MEMORY_BUDGET
    from onnxq.data.sources import model_inputs, open_source

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

        from onnxq.analyze.html import analysis_page

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
    inner = quantized_in_bodies(quant_model)
    if inner:
        where = ", ".join(f"{n} in {name!r}" for name, n in sorted(inner.items()))
        print(
            f"onnxq: note: activation quantizers inside control-flow bodies ({where}): the "
            "ops there are not ranked; their error shows in the outputs of the node that "
            "holds them",
            file=sys.stderr,
        )
    if args.sensitivity:
        _print_sensitivity(args)
    return 0


def _print_sensitivity(args: argparse.Namespace) -> None:
    """The layers of the float model ranked by sensitivity (``analyze --sensitivity``)."""
    from onnxq.config import QuantConfig
    from onnxq.config.recipes import ActivationRecipe
    from onnxq.mixed.search import sensitivity_ranking

    cfg = QuantConfig(backend=args.sensitivity, preprocess=args.preprocess, progress=True)
    recipe = cfg.recipe()
    assert isinstance(recipe, ActivationRecipe)  # no weight_only given: a static recipe
    held, base, ranking = sensitivity_ranking(args.float_model, args.calib, recipe)
    print(
        f"sensitivity ({args.sensitivity}, on {held.source}): all INT8 cosine {base:.6f}; "
        f"the {min(args.top, len(ranking))} layers whose float alone gains most:"
    )
    for s in ranking[: args.top]:
        macs = "?" if s.macs is None else f"{s.macs:,}"
        print(f"  +{s.gain:.6f}  cos {s.alone:.6f}  {macs:>14} MACs  {s.op_type:<8} {s.node}")


def inspect_command(args: argparse.Namespace) -> int:
    import onnx

    from onnxq.errors import ModelLoadError
    from onnxq.materialize.qdq import read_metadata, read_target_cpu

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


def explain_command(args: argparse.Namespace) -> int:
    from onnxq.config.resolve import resolve_config
    from onnxq.place.engine import annotate

    cfg = resolve_config(
        args.config,
        backend=args.backend,
        exclude=tuple(args.exclude) if args.exclude else None,
        target_cpu=args.target_cpu,
        cost_table=args.cost_table,
        precision=args.precision,
        dynamic=True if args.dynamic else None,
        progress=False,
        **selections(args),
    )
    recipe = _placed_recipe(cfg)
    facts, profile = _explained_graph(args.model, recipe)
    ann = annotate(facts, profile, recipe.placement)
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


def _placed_recipe(cfg: QuantConfig) -> ActivationRecipe:
    """The recipe whose Q/DQ placement ``explain`` shows (static or dynamic), or a
    :class:`ConfigError` for a weight-only config: its activations stay float, so there is no
    placement to explain."""
    from onnxq.config.recipes import ActivationRecipe
    from onnxq.errors import ConfigError

    width = cfg.weightonly.weight_only
    recipe = None if width is not None else cfg.recipe()
    if not isinstance(recipe, ActivationRecipe):  # before the options a weight-only run refuses
        raise ConfigError(
            f"weight_only: {width}: onnxq explain shows where the Q/DQ of weights and "
            "activations go, and a weight-only run places none (its activations stay float); "
            "drop weight_only from the config to explain INT8 placement"
        )
    return recipe


def _explained_graph(model: str, cfg: ActivationRecipe) -> tuple[GraphFacts, BackendProfile]:
    """The graph facts and profile that ``onnxq quantize`` places ``model`` with
    (:func:`onnxq.mixed.front.float_graph`: prepared, the float rewrites that need no data
    applied); for a model that quantize refuses as already quantized, a warning that says so,
    and the facts of the model as it is."""
    from onnxq import ir
    from onnxq.errors import UnsupportedModelError
    from onnxq.mixed.front import float_graph
    from onnxq.place.facts import GraphFacts
    from onnxq.prepare.simplify import simplify
    from onnxq.prepare.stage import refuse_quantized

    try:
        front = float_graph(model, cfg)
    except UnsupportedModelError as refused:
        profile, _ = cfg.backend_profile()
        loaded = ir.load_model(model, profile.min_opset)
        try:
            refuse_quantized(loaded, Path(model), profile)
        except UnsupportedModelError as exc:  # explain what is there, but say quantize refuses
            print(f"onnxq: warning: `onnxq quantize` refuses this model: {exc}", file=sys.stderr)
            return GraphFacts.of(ir.Graph(simplify(loaded)[0]), profile), profile
        raise refused from None
    for warning in front.steps.recovery.warnings:
        print(f"onnxq: warning: {warning}", file=sys.stderr)
    return front.facts, front.profile


def tune_cpu_command(args: argparse.Namespace) -> int:
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
