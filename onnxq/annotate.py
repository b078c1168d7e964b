"""Run a profile's rule set over the graph: which tensors get Q/DQ, and why each op does or not.

The result is data: :class:`Annotations` (tensor -> what kind of Q/DQ, read by which consumers)
and one :class:`Decision` per node (quantized by which rule, or the reason it stays float).
Nothing here edits the graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import onnx

from onnxq import ir
from onnxq.backends.profile import WEIGHT_AXES, BackendProfile
from onnxq.config import QuantConfig, TensorSettings
from onnxq.errors import ConfigError
from onnxq.observers import TensorStats
from onnxq.precisions import check_bits, tensor_qtype
from onnxq.rewrites.pattern import Context, Decline, Match, Spec
from onnxq.rewrites.rules import RULE_SETS, SHAPE_ONLY_DATA, WEAK_SHARE


@dataclass
class TensorAnnotation:
    """The merged specs of one tensor."""

    tensor: str
    kind: str
    consumers: list[tuple[str, int]]
    axis: int | None = None
    inputs: tuple[str, ...] = ()
    rules: list[str] = field(default_factory=list)
    output: bool = False  # some rule quantizes it as an op's output
    settings: TensorSettings = field(default_factory=lambda: TensorSettings(""))
    # (low, high) beyond which every quantized reader's output stays the same (a HardSwish
    # below -3): the range never needs to pass them (:func:`saturation_bounds`)
    bounds: tuple[float, float] | None = None

    @property
    def method(self) -> str:
        """The activation range method."""
        return self.settings.method


@dataclass(frozen=True)
class Decision:
    """What happened to one node."""

    node: str
    op_type: str
    quantized: bool
    rule: str
    reason: str = ""
    tensors: tuple[str, ...] = ()


@dataclass
class Annotations:
    """Every annotated tensor (in graph order) and a decision per node."""

    tensors: dict[str, TensorAnnotation]
    decisions: list[Decision]
    notes: list[str] = field(default_factory=list)  # model-wide choices, for the report

    def of_kind(self, kind: str) -> list[TensorAnnotation]:
        return [t for t in self.tensors.values() if t.kind == kind]


def annotate(
    graph: ir.Graph,
    profile: BackendProfile,
    config: QuantConfig,
    float_tensors: dict[str, str] | None = None,
    float_nodes: dict[str, str] | None = None,
) -> Annotations:
    """Match ``profile``'s rule set over ``graph``'s top-level nodes.

    ``float_tensors`` and ``float_nodes`` (name -> reason) keep tensors/nodes float for reasons
    found in the calibration data (see :func:`range_exclusions`).
    """
    ctx = Context(
        profile,
        config,
        graph,
        shape_path=shape_path(graph, profile),
        float_tensors=dict(float_tensors or {}),
        float_nodes={**precision_paths(graph), **(float_nodes or {})},
    )
    heads = head_nodes(graph) if profile.head_method else frozenset()
    scores = score_maps(graph) if profile.head_method else []
    rules = RULE_SETS[profile.rule_set]
    tensors: dict[str, TensorAnnotation] = {}
    decisions: list[Decision] = []
    fused_into: dict[str, str] = {}
    for node in graph.nodes:
        if node.name in ctx.claimed:
            decisions.append(
                Decision(
                    node.name,
                    node.op_type,
                    True,
                    "fused",
                    f"folded into {fused_into.get(node.name, 'its producer')}"
                    "'s output quantization",
                )
            )
            continue
        reason = _precheck(node, ctx)
        if reason:
            decisions.append(Decision(node.name, node.op_type, False, "", reason))
            continue
        candidates = [r for r in rules if node.op_type in r.op_types]
        if not candidates:
            why = profile.float_op_reasons.get(node.op_type)  # a recurrent cell, ...
            decisions.append(
                Decision(
                    node.name,
                    node.op_type,
                    False,
                    "",
                    why or f"no {profile.name} rule quantizes {node.op_type}: it stays float",
                )
            )
            continue
        closest: tuple[str, str] | None = None
        before = set(ctx.claimed)
        for r in candidates:
            result = r.annotate(Match(node, graph), ctx)
            if isinstance(result, Decline):
                closest = closest or (r.name, result.reason)
                continue
            conflict = _conflict(tensors, result)
            if conflict:
                closest = closest or (r.name, conflict)
                ctx.claimed.intersection_update(before)
                continue
            for spec in result:
                _merge(
                    tensors,
                    spec,
                    r.name,
                    config,
                    graph,
                    profile.name,
                    profile.activation_symmetric,
                    profile.output_method,
                )
                head = tensors[spec.tensor]
                if (
                    profile.head_method
                    and head.kind == "activation"
                    and head.settings.method == "auto"
                    and (scores or (not head.output and any(n in heads for n, _ in head.consumers)))
                ):
                    head.settings = replace(head.settings, method=profile.head_method)
                ctx.quantized[spec.tensor] = tensors[spec.tensor].kind
            ctx.claimed.add(node.name)
            for extra in ctx.claimed - before - {node.name}:
                fused_into[extra] = node.name
            decisions.append(
                Decision(
                    node.name, node.op_type, True, r.name, tensors=tuple(s.tensor for s in result)
                )
            )
            break
        else:
            assert closest is not None
            decisions.append(Decision(node.name, node.op_type, False, closest[0], closest[1]))
    for ann in tensors.values():
        if ann.kind in ("activation", "weight"):  # an override's bits must fit its type
            qtype = tensor_qtype(ann.kind, ann.settings.precision, profile.activation_dtype)
            check_bits(ann.settings.bits, qtype, ann.tensor)
        if ann.kind == "activation":
            ann.bounds = saturation_bounds(graph, ann.tensor, ann.consumers)
    notes: list[str] = []
    if scores and any(
        t.method == profile.head_method for t in tensors.values() if t.kind == "activation"
    ):
        notes.append(
            f"output {', '.join(repr(o) for o in scores)} holds per-element sigmoid scores (a "
            f"detector's or a segmentation map's): 'auto' calibrates every activation with "
            f"{profile.head_method}, which keeps the peaks such scores are read from"
        )
    return Annotations(tensors, decisions, notes)


def saturation_bounds(
    graph: ir.Graph, tensor: str, consumers: list[tuple[str, int]]
) -> tuple[float, float] | None:
    """The (low, high) beyond which none of ``consumers``' outputs change any more, or None.

    Relu is constant below 0, Clip outside its constant bounds, HardSigmoid outside
    ``[-beta/alpha, (1-beta)/alpha]``, HardSwish below -3, and ``x * HardSigmoid(x)`` (the
    hardswish of opsets before 14) below HardSigmoid's lower bound, where the gate is 0.  A
    range clipped to the returned bounds gives those readers the same outputs as the
    unclipped one, and finer steps inside: a conv output over [-35, 145] in front of a
    hardswish needs only [-3, 145].  None when a reader has no such bound on both sides."""
    low, high = math.inf, -math.inf
    for name, index in consumers:
        node = graph.node_by_name(name)
        bound = None if node is None else _reader_bounds(graph, node, index, tensor)
        if bound is None:
            return None
        low, high = min(low, bound[0]), max(high, bound[1])
    if not consumers or (low == -math.inf and high == math.inf):
        return None
    return low, high


# ops whose output stays the same beyond a fixed input bound (attribute-free; Clip and
# HardSigmoid take theirs from the node)
SATURATION_BOUNDS: dict[str, tuple[float, float]] = {
    "Relu": (0.0, math.inf),
    "HardSwish": (-3.0, math.inf),
}


def _reader_bounds(
    graph: ir.Graph, node: onnx.NodeProto, index: int, tensor: str
) -> tuple[float, float] | None:
    """Where one reader of ``tensor`` (at input ``index``) saturates."""
    if node.domain not in ir.DEFAULT_DOMAINS or (index != 0 and node.op_type != "Mul"):
        return None
    if node.op_type in SATURATION_BOUNDS:
        return SATURATION_BOUNDS[node.op_type]
    if node.op_type == "Clip":
        lo, hi = graph.clip_bounds(node)
        return (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
    if node.op_type == "HardSigmoid":
        return _hardsigmoid_bounds(node)
    if node.op_type == "Mul" and len(node.input) == 2:
        gate = graph.producer.get(node.input[1 - index])
        if gate is not None and gate.op_type == "HardSigmoid" and gate.input[:1] == [tensor]:
            bound = _hardsigmoid_bounds(gate)
            return None if bound is None else (bound[0], math.inf)
    return None


def _hardsigmoid_bounds(node: onnx.NodeProto) -> tuple[float, float] | None:
    attrs = ir.node_attrs(node)
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    if not alpha > 0:
        return None
    return -beta / alpha, (1.0 - beta) / alpha


def _precheck(node, ctx: Context) -> str | None:
    excluded = ctx.config.node_excluded(node.name, node.op_type)
    if excluded:
        return f"excluded by {excluded}"
    if ir.is_integer_op(node.op_type) or node.op_type in ir.QDQ_OPS:
        return (
            f"{node.op_type} is already a quantized op (the model was quantized before): "
            "onnxq leaves it as it is"
        )
    if ir.has_subgraph(node):
        return (
            f"{node.op_type} holds subgraphs; onnxq quantizes the top-level graph and "
            "leaves control-flow bodies float"
        )
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


def _conflict(tensors: dict[str, TensorAnnotation], specs: list[Spec]) -> str | None:
    for spec in specs:
        have = tensors.get(spec.tensor)
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


def _merge(
    tensors: dict[str, TensorAnnotation],
    spec: Spec,
    rule_name: str,
    config: QuantConfig,
    graph: ir.Graph,
    profile_name: str = "",
    symmetric_only: bool = False,
    output_method: str | None = None,
) -> None:
    entry = tensors.get(spec.tensor)
    if entry is None:
        entry = TensorAnnotation(spec.tensor, spec.kind, [], spec.axis, spec.inputs)
        tensors[spec.tensor] = entry
    for c in spec.consumers:
        if c not in entry.consumers:
            entry.consumers.append(c)
    entry.rules.append(rule_name)
    readers = [(n.name, n.op_type) for n, _ in graph.consumers.get(spec.tensor, [])]
    entry.settings = config.settings_for(spec.tensor, readers)
    if spec.output:
        entry.output = True
    if entry.output and entry.settings.method == "auto" and output_method:
        entry.settings = replace(entry.settings, method=output_method)
    if entry.kind == "weight" and not entry.settings.per_channel:
        entry.axis = None
    if entry.kind == "activation" and entry.settings.symmetric is False and symmetric_only:
        raise ConfigError(
            f"an override makes tensor {spec.tensor!r} asymmetric, but the {profile_name} "
            "backend requires symmetric quantization (zero point 0); drop 'symmetric: false' "
            "or use --backend onnxruntime"
        )


FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
)


def shape_path(graph: ir.Graph, profile: BackendProfile) -> set[str]:
    """Tensors computed from shapes or indices (downstream of Shape/Size/..., or integer)."""
    path: set[str] = set()
    for node in graph.nodes:
        outs = [o for o in node.output if o]
        if node.op_type in profile.shape_ops:
            path.update(outs)
            continue
        live = [t for t in node.input if t and not graph.is_const(t)]
        if live and all(t in path for t in live):
            path.update(outs)
    return path


def grouped_conv_inputs(graph: ir.Graph) -> dict[str, str]:
    """Grouped (depthwise) Conv node name -> its activation input."""
    return {
        n.name: n.input[0]
        for n in graph.nodes
        if n.op_type == "Conv"
        and n.domain in ir.DEFAULT_DOMAINS
        and n.input
        and int(ir.node_attrs(n).get("group", 1)) > 1
    }


# ops a per-position normalisation is reached through (a feature encoder's convs and GELUs,
# the Transpose to channels-last): they keep a quiet position quiet
_POSITION_PATH_OPS = frozenset(
    {
        "Conv",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Erf",
        "Tanh",
        "Sigmoid",
        "Relu",
        "LeakyRelu",
        "Gelu",
        "Pow",
        "Clip",
        "Neg",
        "Elu",
        "Selu",
        "Softplus",
        "HardSigmoid",
        "HardSwish",
        "Mish",
        "Identity",
        "Transpose",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
    }
)


def position_norm_convs(graph: ir.Graph) -> dict[str, str]:
    """1-D Conv node name -> its activation input, for the convs whose output reaches a
    ``LayerNormalization`` through :data:`_POSITION_PATH_OPS` only: that normalisation rescales
    every position (a frame) to the same size, so a position that int8 leaves few levels (a
    quiet frame far below the loud ones) comes out as large as the rest, noise included.
    One walk up from every LayerNormalization, as :func:`precision_paths` walks from a Log."""
    found: dict[str, str] = {}

    def step(_tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if (
            node is None
            or node.domain not in ir.DEFAULT_DOMAINS
            or node.op_type not in _POSITION_PATH_OPS
        ):
            return []
        if node.op_type == "Conv":
            weight = graph.shape(node.input[1]) if len(node.input) > 1 else None
            if weight is not None and len(weight) == 3:
                found[node.name] = node.input[0]
        data_first = node.op_type == "Conv" or node.op_type in _DATA_FIRST_OPS
        return [
            x for x in (node.input[:1] if data_first else node.input) if x and not graph.is_const(x)
        ]

    graph.walk_up(
        [
            n.input[0]
            for n in graph.nodes
            if n.op_type == "LayerNormalization" and n.input and n.input[0]
        ],
        step,
    )
    return found


def range_exclusions(
    annotations: Annotations,
    stats: dict[str, TensorStats],
    config: QuantConfig,
    grouped: dict[str, str],
    positions: dict[str, str] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Tensors and nodes to keep float because of what the calibration data showed.

    * a tensor whose magnitude reaches ``config.mask_threshold`` (an additive attention mask
      filled with -1e4 or -3.4e38, or any range so wide that int8 would wipe out its ordinary
      values);
    * a node whose activation inputs share one output scale (Concat) while their ranges differ
      by more than ``config.concat_range_ratio`` (box coordinates next to class scores);
    * a grouped (depthwise) Conv of ``grouped`` (node -> input) whose input has more than
      ``config.weak_channel_fraction`` of its channels peaking below ``WEAK_SHARE`` of the
      tensor's peak: each such channel alone feeds its outputs, with fewer than 8 of int8's 127
      levels;
    * a 1-D Conv of ``positions`` (:func:`position_norm_convs`) whose input has more than
      ``config.weak_position_fraction`` of its positions (frames) peaking below ``WEAK_SHARE``
      of the tensor's peak: the LayerNormalization after it blows their rounding noise up to
      full size (wav2vec2's GroupNorm feature encoder on speech with pauses).
    """
    max_abs, concat_ratio = config.mask_threshold, config.concat_range_ratio
    weak_fraction = config.weak_channel_fraction
    float_tensors: dict[str, str] = {}
    for ann in annotations.of_kind("activation"):
        s = stats.get(ann.tensor)
        if s is None or s.count == 0:
            continue
        amax = max(abs(s.min), abs(s.max))
        if amax >= max_abs:
            float_tensors[ann.tensor] = (
                f"tensor {ann.tensor!r} reaches |x| = {amax:.3g} (>= {max_abs:g}): a fill "
                "value (an attention mask) or a range so wide that int8 would erase its "
                "ordinary values, so it stays float"
            )
    float_nodes: dict[str, str] = {}
    for d in annotations.decisions:
        if not d.quantized or d.rule != "concat":
            continue
        ranges = [
            max(abs(stats[t].min), abs(stats[t].max))
            for t in d.tensors
            if t in stats and stats[t].count
        ]
        ranges = [r for r in ranges if r > 0]
        if len(ranges) >= 2 and max(ranges) / min(ranges) > concat_ratio:
            float_nodes[d.node] = (
                f"its inputs' ranges differ {max(ranges) / min(ranges):.0f}x (> {concat_ratio:g}x);"
                " one shared scale would crush the small ones, so it stays float"
            )
    # the two weak-share rules: (node -> its input, the count of weak parts, the fraction
    # allowed, its option, what the parts are, why the node stays float)
    weak_rules = (
        (
            grouped,
            TensorStats.weak_channels,
            weak_fraction,
            "weak_channel_fraction",
            "channels",
            "one per-tensor int8 scale leaves them under 8 levels, and each feeds its "
            "own outputs alone; the grouped conv stays float",
        ),
        (
            positions or {},
            TensorStats.weak_positions,
            config.weak_position_fraction,
            "weak_position_fraction",
            "positions (frames)",
            "one int8 scale leaves them under 8 "
            "levels, and the LayerNormalization after it scales each position to the same size, "
            "noise included; the conv stays float",
        ),
    )
    for inputs, weak_parts, fraction, option, parts, why in weak_rules:
        for d in annotations.decisions:
            tensor = inputs.get(d.node)
            if not d.quantized or tensor is None or tensor not in stats:
                continue
            weak = weak_parts(stats[tensor], WEAK_SHARE)
            if weak is not None and weak[0] > fraction * weak[1]:
                float_nodes[d.node] = (
                    f"{weak[0]} of its input's {weak[1]} {parts} peak below 1/"
                    f"{round(1 / WEAK_SHARE)} of the tensor's peak (> {option}={fraction:g}): "
                    f"{why}"
                )
    return float_tensors, float_nodes


# ops a model's output is read through after its last weighted layer: they move, select or
# squash values without mixing them (a binary op counts when its other input is a constant)
_HEAD_PATH_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "Sigmoid",
        "HardSigmoid",
        "Tanh",
        "Relu",
        "LeakyRelu",
        "Clip",
        "Softmax",
        "LogSoftmax",
        "Add",
        "Sub",
        "Mul",
        "Div",
        # interpolates neighbours of one channel: a score map upsampled to the input's size
        "Resize",
    }
)
# head-path ops whose inputs after the first are shapes, indices, sizes or bounds
_DATA_FIRST_OPS = frozenset(
    {"Reshape", "Slice", "Gather", "Split", "Squeeze", "Unsqueeze", "Clip", "Resize"}
)


def _weighted(node: onnx.NodeProto) -> bool:
    return node.domain in ir.DEFAULT_DOMAINS and node.op_type in WEIGHT_AXES


# ops that carry a value's magnitude into a logarithm (or a tree's thresholds) without
# squashing it: linear maps, products, powers and sums, reductions, floors (Clip/Max with an
# epsilon), data movement
_LOG_PATH_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "Einsum",
        "BatchNormalization",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Abs",
        "Pow",
        "Sqrt",
        "Max",
        "Min",
        "Clip",
        "Sum",
        "Mean",
        "ReduceSum",
        "ReduceMean",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "AveragePool",
        "GlobalAveragePool",
        "Identity",
        "Cast",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Gather",
        "Concat",
        "Pad",
        "Expand",
        "Tile",
    }
)
# log-path ops whose inputs after the first are shapes, sizes, axes, bounds, statistics or
# exponents
_LOG_DATA_FIRST_OPS = _DATA_FIRST_OPS | {
    "Pad",
    "Expand",
    "Tile",
    "ReduceSum",
    "ReduceMean",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "BatchNormalization",
    "Pow",
}


# ONNX-ML ops that compare their input features with learned split thresholds
_TREE_OPS = frozenset({"TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble"})


def precision_paths(graph: ir.Graph) -> dict[str, str]:
    """Nodes whose output reaches a ``Log`` or a tree ensemble through :data:`_LOG_PATH_OPS`
    alone -> why they stay float.

    A logarithm spreads out small values: a power spectrum's quiet bins, 1e-6 next to 1e2,
    are as far apart after it as its loud ones.  int8's uniform steps (1/127 of the peak)
    erase them, so the spectrogram front ends of audio models (STFT/CQT convs, squares and
    sums, a mel MatMul, then Log) lose everything they carry.  A tree ensemble (scikit-learn's
    random forests and boosted trees, ``ai.onnx.ml``) compares each feature with hundreds of
    split thresholds: a feature moved by one int8 step crosses some of them and changes a
    leaf, so the scaling, PCA or other linear ops in front of the trees stay float too.  The
    walk up from each such op stops at any op not listed (an activation such as Relu or
    Softmax ends a learned layer's output), at graph inputs and at constants."""
    found: dict[str, str] = {}
    for sink in graph.nodes:
        if not sink.input or not sink.input[0]:
            continue
        if sink.op_type == "Log" and sink.domain in ir.DEFAULT_DOMAINS:
            why = (
                f"its output reaches the logarithm {sink.name!r} through linear, power and "
                "data-movement ops only: int8's uniform steps would erase the small values "
                "the logarithm spreads out, so it stays float"
            )
        elif sink.op_type in _TREE_OPS and sink.domain == "ai.onnx.ml":
            why = (
                f"its output reaches the split thresholds of the tree ensemble {sink.name!r} "
                "through linear and data-movement ops only: a feature moved by one int8 "
                "step crosses thresholds and changes the trees' decisions, so it stays float"
            )
        else:
            continue
        path: list[str] = []
        graph.walk_up([sink.input[0]], functools.partial(_log_path_step, graph, path))
        for name in path:
            found.setdefault(name, why)
    return found


def _log_path_step(
    graph: ir.Graph, path: list[str], _tensor: str, node: onnx.NodeProto | None
) -> list[str]:
    """Add ``node`` to ``path`` and give the tensors to walk on to, if it carries magnitudes."""
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or node.op_type not in _LOG_PATH_OPS:
        return []
    path.append(node.name)
    inputs = node.input[:1] if node.op_type in _LOG_DATA_FIRST_OPS else node.input
    return [x for x in inputs if x and not graph.is_const(x)]


def _head_path_step(graph: ir.Graph, node: onnx.NodeProto | None) -> list[str]:
    """The tensors a walk up from an output continues to through ``node`` (none at a
    weighted op, which ends a head path, or at an op that mixes values)."""
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or node.op_type not in _HEAD_PATH_OPS:
        return []  # a weighted op ends the path, an op not listed mixes values
    if node.op_type in _DATA_FIRST_OPS:
        return [node.input[0]] if node.input and node.input[0] else []
    data = [x for x in node.input if x and not graph.is_const(x)]
    if node.op_type in ("Add", "Sub", "Mul", "Div") and len(data) != 1:
        return []  # both inputs computed: it mixes values
    return data


def head_nodes(graph: ir.Graph) -> frozenset[str]:
    """The weighted ops (Conv, ConvTranspose, Gemm, MatMul) a graph output is read from
    through nothing but data movement, a constant bias/scale and Sigmoid/Softmax: a model's
    heads (class scores, boxes, logits).  Their outputs are read at their extremes, with no
    later layer to average a clipped input out."""
    heads: set[str] = set()

    def step(tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if node is not None and _weighted(node):
            heads.add(node.name)
        return _head_path_step(graph, node)

    graph.walk_up(graph.graph_outputs, step)
    return frozenset(heads)


def score_maps(graph: ir.Graph) -> list[str]:
    """Graph outputs of rank >= 3 read from a weighted op through a Sigmoid (or HardSigmoid)
    and the ops of :func:`head_nodes`' paths: per-element scores a detector or a segmentation
    model thresholds, so their extremes decide.  Clipping any activation moved them on every
    such model measured (docs/benchmarks.md)."""
    return [
        out
        for out in graph.graph_outputs
        if len(graph.shape(out) or ()) >= 3 and _read_through_sigmoid(graph, out)
    ]


def _read_through_sigmoid(graph: ir.Graph, output: str) -> bool:
    """Whether a walk up the head paths from ``output`` meets a Sigmoid and a weighted op."""
    met: set[str] = set()

    def step(tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if node is not None and node.op_type in ("Sigmoid", "HardSigmoid"):
            met.add("sigmoid")
        if node is not None and _weighted(node):
            met.add("head")
        return _head_path_step(graph, node)

    graph.walk_up([output], step)
    return met == {"sigmoid", "head"}
