"""The rule engine: run a profile's rule set over the graph's nodes, those inside If/Loop/Scan
bodies included, and collect what the rules claim into
:class:`~onnxq.place.annotations.Annotations`.

The engine only matches and collects.  For each node in graph order it asks the rules that
anchor on the node's op type, in priority order, for a :class:`~onnxq.place.rules.pattern.Claim`;
the first claim that does not clash with an earlier one is applied (its specs merged, its
node and folded nodes marked claimed), and a decline or a clash leaves nothing behind.  A node
nobody claims gets the reason of the closest rule.  Nothing here edits the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.placement import PlacementOptions
from onnxq.errors import ConfigError
from onnxq.numerics.precisions import check_bits, tensor_qtype
from onnxq.place.annotations import Annotations, Decision, Excluded, TensorAnnotation
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Rule, Spec
from onnxq.place.rules.sets import RULE_SETS
from onnxq.place.rules.specs import SHAPE_ONLY_DATA
from onnxq.place.selection import select
from onnxq.place.shift import mark_shifts

FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
)


@dataclass
class _Placement:
    """The engine's state while it walks the graph (rules see it through :class:`Context`)."""

    tensors: dict[str, TensorAnnotation] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    claimed: set[str] = field(default_factory=set)
    quantized: dict[str, str] = field(default_factory=dict)  # tensor -> kind
    folded_into: dict[str, str] = field(default_factory=dict)  # folded node -> into what


def annotate(
    facts: GraphFacts,
    profile: BackendProfile,
    options: PlacementOptions,
    excluded: Excluded | None = None,
) -> Annotations:
    """Match ``profile``'s rule set over the nodes of ``facts.graph``, then over the nodes of
    each control-flow body (``facts.bodies``): the same rules, facts and exclusions, with the
    body as the graph the rules walk.

    ``excluded`` names the tensors and nodes that the calibration data keeps float (see
    :mod:`onnxq.place.exclusions`), with the reasons the decisions will give.
    """
    excluded = excluded or Excluded()
    state = _Placement()
    selected = select(ir.every_node(facts.graph.proto), options)
    float_nodes = {**facts.precision_paths, **selected.nodes, **excluded.nodes}
    rules = _rules_by_op(RULE_SETS[profile.rule_set], profile)
    for scope in facts.scopes():
        ctx = Context(
            profile,
            options,
            facts.within(scope),
            float_tensors=excluded.tensors,
            float_nodes=float_nodes,
            claimed=state.claimed,
            quantized=state.quantized,
        )
        for node in scope.nodes:
            state.decisions.append(_decide(node, rules.get(node.op_type, ()), ctx, state))
    for ann in state.tensors.values():
        if ann.kind == "activation":
            ann.bounds = facts.saturation_bounds(ann.consumers)
    by_scores = _score_map_ranges(facts, profile, options, state)
    notes = _notes(facts, profile, by_scores) + selected.notes
    if options.shift_activations:
        notes += mark_shifts(facts.graph, profile, state.tensors)
    scores = profile.head_method if by_scores else None
    return Annotations(state.tensors, state.decisions, notes, scores)


def _rules_by_op(rules: tuple[Rule, ...], profile: BackendProfile) -> dict[str, list[Rule]]:
    """Op type -> the rules that anchor on it, in priority order."""
    by_op: dict[str, list[Rule]] = {}
    for r in rules:
        for op in sorted(r.anchors(profile)):
            by_op.setdefault(op, []).append(r)
    return by_op


def _decide(
    node: onnx.NodeProto, rules: Sequence[Rule], ctx: Context, state: _Placement
) -> Decision:
    """The decision for one node; a successful claim is applied to ``state``."""
    if node.name in state.claimed:
        into = state.folded_into.get(node.name, "its producer's output quantization")
        return Decision(node.name, node.op_type, True, "fused", f"folded into {into}")
    reason = _precheck(node, ctx)
    if reason:
        return Decision(node.name, node.op_type, False, "", reason)
    if not rules:
        reason = ctx.profile.float_op_reasons.get(node.op_type)  # a recurrent cell, ...
        reason = reason or f"no {ctx.profile.name} rule quantizes {node.op_type}: it stays float"
        return Decision(node.name, node.op_type, False, "", reason)
    closest: tuple[str, str] | None = None
    for r in rules:
        result = r.annotate(Match(node, ctx.graph), ctx)
        why = result.reason if isinstance(result, Decline) else _conflict(result, state)
        if why is not None:
            closest = closest or (r.name, why)
            continue
        assert isinstance(result, Claim)
        _apply(node, r, result, ctx, state)
        tensors = tuple(s.tensor for s in result.specs)
        return Decision(node.name, node.op_type, True, r.name, "", tensors, r.shares_scale)
    assert closest is not None
    return Decision(node.name, node.op_type, False, closest[0], closest[1])


def _precheck(node: onnx.NodeProto, ctx: Context) -> str | None:
    """Why ``node`` stays float whatever the rules say, or None."""
    excluded = ctx.options.node_excluded(node.name, node.op_type)
    if excluded:
        return f"excluded by {excluded}"
    if ir.is_integer_op(node.op_type) or node.op_type in ir.QDQ_OPS:
        return (
            f"{node.op_type} is already a quantized op (the model was quantized before): "
            "onnxq leaves it as it is"
        )
    if ir.has_subgraph(node):
        return _holds_bodies(node)
    if node.domain not in ir.DEFAULT_DOMAINS:
        kind = "ONNX-ML op" if node.domain == "ai.onnx.ml" else "custom-domain op"
        return f"{kind} ({node.domain}) stays float"
    if node.name in ctx.float_nodes:  # from the calibration data, or on a logarithm's path
        return ctx.float_nodes[node.name]
    if any(o in ctx.graph.subgraph_reads for o in node.output):
        return (
            "its output is read inside a control-flow subgraph; Q/DQ next to such reads "
            "makes onnxruntime's optimizer abort, so it stays float"
        )
    if node.op_type in ctx.profile.shape_ops or all(t in ctx.shape_path for t in node.output if t):
        if any(ctx.graph.elem_type(t) in FLOAT_TYPES for t in node.output if t):
            return SHAPE_ONLY_DATA + ": never quantized"
        return "shape/index computation: never quantized"
    return None


def _holds_bodies(node: onnx.NodeProto) -> str:
    """Why a node with graph attributes stays float itself."""
    attrs = ", ".join(a.name for a in node.attribute if ir.attr_graphs(a))
    if ir.opens_body(node):
        return (
            f"{node.op_type} is control flow: the ops inside its {attrs} are placed by the "
            "same rules and have decisions of their own"
        )
    return (
        f"{node.op_type} holds subgraphs ({attrs}); onnxq places Q/DQ inside If, Loop and "
        "Scan bodies only, so those stay float"
    )


def _conflict(taken: Claim, state: _Placement) -> str | None:
    """Why ``taken`` clashes with the placement so far (a tensor quantized another way, a
    folded node already claimed), or None."""
    for name in taken.folded:
        if name in state.claimed:
            return f"node {name!r} is already claimed by another rule"
    for spec in taken.specs:
        have = state.tensors.get(spec.tensor)
        if have is None:
            continue
        if have.kind == "shared" and spec.kind == "activation":
            continue  # a reader of a shared tensor takes the shared qparams
        if have.kind != spec.kind or have.axis != spec.axis:
            return (
                f"tensor {spec.tensor!r} is already quantized as {have.kind}"
                f"{'' if have.axis is None else f' (axis {have.axis})'} by "
                f"{', '.join(sorted(set(have.rules)))}; a second, different spec would clash"
            )
    return None


def _apply(node: onnx.NodeProto, r: Rule, taken: Claim, ctx: Context, state: _Placement) -> None:
    """Merge a claim's specs into the placement and mark its nodes claimed."""
    for spec in taken.specs:
        entry = _merge(state.tensors, spec, r.name, ctx)
        if _reads_at_extremes(entry, ctx):
            entry.settings = replace(entry.settings, method=ctx.profile.head_method or "")
        state.quantized[spec.tensor] = entry.kind
    state.claimed.add(node.name)
    for name in taken.folded:
        state.claimed.add(name)
        state.folded_into[name] = f"{node.name}'s {taken.folded_into}"


def _reads_at_extremes(entry: TensorAnnotation, ctx: Context) -> bool:
    """Whether ``auto`` means the profile's head method for this activation: a head's input,
    or any activation of a model whose outputs are score maps (unless ``score_map_ranges``
    says ``auto``)."""
    facts = ctx.facts
    return (
        ctx.profile.head_method is not None
        and entry.kind == "activation"
        and entry.settings.method == "auto"
        and bool(
            (facts.score_maps and ctx.options.score_map_ranges != "auto")
            or (not entry.output and any(n in facts.heads for n, _ in entry.consumers))
        )
    )


def _merge(
    tensors: dict[str, TensorAnnotation], spec: Spec, rule_name: str, ctx: Context
) -> TensorAnnotation:
    """Add one spec to its tensor's annotation (made on first use) and resolve its settings."""
    entry = tensors.get(spec.tensor)
    if entry is None:
        entry = TensorAnnotation(spec.tensor, spec.kind, [], spec.axis, spec.inputs)
        tensors[spec.tensor] = entry
    for c in spec.consumers:
        if c not in entry.consumers:
            entry.consumers.append(c)
    entry.rules.append(rule_name)
    readers = [(n.name, n.op_type) for n, _ in ctx.graph.consumers.get(spec.tensor, [])]
    entry.settings = ctx.options.settings_for(spec.tensor, readers)
    if spec.output:
        entry.output = True
    output_method = ctx.profile.output_method
    if entry.output and entry.settings.method == "auto" and output_method:
        entry.settings = replace(entry.settings, method=output_method)
    if entry.kind == "weight" and not entry.settings.per_channel:
        entry.axis = None
    if entry.kind in ("activation", "weight"):  # an override's bits must fit the type
        qtype = tensor_qtype(entry.kind, entry.settings.precision, ctx.profile.activation_dtype)
        check_bits(entry.settings.bits, qtype, spec.tensor)
    if (
        entry.kind == "activation"
        and entry.settings.symmetric is False
        and ctx.profile.activation_symmetric
    ):
        raise ConfigError(
            f"an override makes tensor {spec.tensor!r} asymmetric, but the {ctx.profile.name} "
            "backend requires symmetric quantization (zero point 0); drop 'symmetric: false' "
            "or use --backend onnxruntime"
        )
    return entry


def _score_map_ranges(
    facts: GraphFacts, profile: BackendProfile, options: PlacementOptions, state: _Placement
) -> bool:
    """Whether 'auto' means the profile's head method for this model's activations (its
    outputs are per-element sigmoid scores, ``score_map_ranges`` is not ``auto``, and some
    activation took that method)."""
    return (
        bool(facts.score_maps)
        and options.score_map_ranges != "auto"
        and any(
            t.method == profile.head_method
            for t in state.tensors.values()
            if t.kind == "activation"
        )
    )


def _notes(facts: GraphFacts, profile: BackendProfile, by_scores: bool) -> list[str]:
    """Model-wide choices worth a note in the report."""
    if not by_scores:
        return []
    return [
        f"output {', '.join(repr(o) for o in facts.score_maps)} holds per-element sigmoid scores "
        f"(a detector's or a segmentation map's): 'auto' calibrates every activation with "
        f"{profile.head_method}, which keeps the peaks such scores are read from"
    ]
