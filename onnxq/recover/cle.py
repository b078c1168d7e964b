"""Cross-layer equalization: rescale the channels between two Conv layers so that the ranges
of their weights agree (Nagel et al., "Data-Free Quantization Through Weight Equalization and
Bias Correction", 2019; AIMET's and Sparsebit's CLE).

For ``Conv1 -> f -> Conv2`` with ``f`` positively homogeneous (nothing, Relu, LeakyRelu, a
PRelu whose slope does not vary along the scaled channels: ``f(x / s) = f(x) / s`` for
``s > 0``), dividing Conv1's output channel ``i`` (its weights and bias) by ``s_i`` and
multiplying the weights that Conv2 applies to input channel ``i`` by ``s_i`` leaves the
model's function unchanged (float rounding apart).  With ``r1_i`` the largest magnitude of
Conv1's weights for output ``i`` and ``r2_i`` that of Conv2's weights for input ``i``,
``s_i = sqrt(r1_i / r2_i)`` makes both ``sqrt(r1_i r2_i)``; the pairs of a chain are
equalized in turn until the scales settle.  Depthwise and grouped Convs are pairs like any
other.

A ``Clip`` (ReLU6) between the two is left alone: ``Clip(x / s, 0, 6)`` equals ``Clip(x, 0,
6) / s`` only for ``s = 1``, the bound would have to become ``6 / s_i`` per channel, which a
Clip cannot hold (rewriting it as ``Min(Relu(x), 6 / s)`` is exact, but costs an op per pair
that TensorRT and onnxruntime no longer fuse into the Conv, and measured on mobilenet_v2 it
did not pay: docs/accuracy.md).  The report names each such pair and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx

from onnxq import ir

HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu"})
MAX_ROUNDS = 20  # passes over the pairs; the scales settle long before in practice
SETTLED = 1e-3  # a pass whose scales all lie within this of 1 ends the iteration
SCALE_LIMITS = (1e-4, 1e4)  # one pass never scales a channel further than this


@dataclass(frozen=True)
class PairDecision:
    """One Conv -> [activation] -> Conv pair: equalized, or why not."""

    first: str
    second: str
    activation: str  # op type between them ("" for none)
    equalized: bool
    reason: str = ""
    # max/min over channels of the weight-range ratio r1/r2 before and after (equalized only)
    spread_before: float = 0.0
    spread_after: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ConvPair:
    """Conv -> [one single-reader activation] -> Conv, the second reading ``tensor`` as data."""

    first: onnx.NodeProto
    activation: onnx.NodeProto | None
    second: onnx.NodeProto

    @property
    def tensor(self) -> str:
        """The activation between the two Convs."""
        return (self.activation or self.first).output[0]


def equalize(graph: ir.Graph) -> tuple[bool, list[PairDecision]]:
    """Equalize every eligible Conv pair of ``graph`` (edited through its methods); returns
    whether anything changed and one decision per candidate pair."""
    pairs: list[ConvPair] = []
    decisions: dict[tuple[str, str], PairDecision] = {}
    for pair in conv_pairs(graph):
        reason = _problem(graph, pair.first, pair.activation, pair.second)
        act = pair.activation.op_type if pair.activation is not None else ""
        if reason:
            decisions[(pair.first.name, pair.second.name)] = PairDecision(
                pair.first.name, pair.second.name, act, False, reason
            )
        else:
            pairs.append(pair)
    if not pairs:
        return False, list(decisions.values())
    weights = _own_weights(graph, pairs)
    before = {(p.first.name, p.second.name): _spread(weights, p) for p in pairs}
    for _ in range(MAX_ROUNDS):
        moved = 0.0
        for pair in pairs:
            moved = max(moved, _equalize_pair(weights, pair))
        if moved < SETTLED:
            break
    for name, value in weights.items():
        graph.set_initializer(name, value.astype(np.float32))
    for pair in pairs:
        key = (pair.first.name, pair.second.name)
        decisions[key] = PairDecision(
            pair.first.name,
            pair.second.name,
            pair.activation.op_type if pair.activation is not None else "",
            True,
            spread_before=before[key],
            spread_after=_spread(weights, pair),
        )
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    return True, sorted(decisions.values(), key=lambda d: order.get(d.first, 0))


# ------------------------------------------------------------------------------- matching
def conv_pairs(graph: ir.Graph) -> list[ConvPair]:
    """Every Conv whose output reaches one Conv through at most one single-reader activation,
    read there as the data input (in graph order)."""
    found = []
    for first in graph.nodes:
        if first.op_type != "Conv" or first.domain not in ir.DEFAULT_DOMAINS:
            continue
        second = _only_reader(graph, first.output[0])
        activation = None
        if second is not None and second.op_type != "Conv":
            activation = second
            second = _only_reader(graph, activation.output[0]) if activation.output else None
        if second is None or second.op_type != "Conv":
            continue
        pair = ConvPair(first, activation, second)
        if second.input[0] == pair.tensor:  # not read as a weight
            found.append(pair)
    return found


def _only_reader(graph: ir.Graph, tensor: str) -> onnx.NodeProto | None:
    """The single node that reads ``tensor``, when it is not also a graph output or read in a
    subgraph."""
    readers = graph.consumers.get(tensor, [])
    if len(readers) != 1 or tensor in graph.graph_outputs or tensor in graph.subgraph_reads:
        return None
    return readers[0][0]


def _problem(
    graph: ir.Graph,
    first: onnx.NodeProto,
    activation: onnx.NodeProto | None,
    second: onnx.NodeProto,
) -> str:
    """Why the pair cannot be equalized exactly ("" when it can)."""
    if activation is not None:
        if activation.op_type == "Clip":
            return (
                "a Clip (ReLU6) sits between them: per-channel bounds after scaling are not "
                "expressible in a Clip, so scaling would change its output"
            )
        if activation.op_type not in HOMOGENEOUS or activation.domain not in ir.DEFAULT_DOMAINS:
            return f"{activation.op_type} between them does not commute with a per-channel scale"
        if activation.op_type == "PRelu" and not _slope_per_tensor_or_channel(graph, activation):
            return "the PRelu slope is not a constant per-channel vector or scalar"
    for node in (first, second):
        w = graph.const_value(node.input[1])
        if w is None or w.dtype != np.float32:
            return f"{node.name}'s weight is not a float32 constant"
        if len(graph.consumers.get(node.input[1], [])) != 1:
            return f"{node.name}'s weight is shared with another node"
    if len(first.input) > 2 and first.input[2]:
        bias = graph.const_value(first.input[2])
        if bias is None or len(graph.consumers.get(first.input[2], [])) != 1:
            return f"{first.name}'s bias is not a constant of its own"
    w1 = graph.const_value(first.input[1])
    w2 = graph.const_value(second.input[1])
    assert w1 is not None and w2 is not None
    groups = int(ir.node_attrs(second).get("group", 1))
    if w1.shape[0] != w2.shape[1] * groups:
        return "the first Conv's outputs do not match the second Conv's inputs"
    return ""


def _slope_per_tensor_or_channel(graph: ir.Graph, prelu: onnx.NodeProto) -> bool:
    slope = graph.const_value(prelu.input[1]) if len(prelu.input) > 1 else None
    return slope is not None and (slope.size == 1 or slope.reshape(-1).size == slope.shape[0])


# ------------------------------------------------------------------------------- scaling
def _own_weights(graph: ir.Graph, pairs: list[ConvPair]) -> dict[str, np.ndarray]:
    """Float64 copies of every weight and bias the pairs scale, by initializer name."""
    names = set()
    for p in pairs:
        names |= {p.first.input[1], p.second.input[1]}
        if len(p.first.input) > 2 and p.first.input[2]:
            names.add(p.first.input[2])
    out = {}
    for name in sorted(names):
        value = graph.const_value(name)
        assert value is not None
        out[name] = np.array(value, dtype=np.float64)
    return out


def _ranges(weights: dict[str, np.ndarray], pair: ConvPair) -> tuple[np.ndarray, np.ndarray, int]:
    """Per channel between the two: the first Conv's output range and the second's input
    range, and the second's groups."""
    w1 = weights[pair.first.input[1]]
    w2 = weights[pair.second.input[1]]
    groups = int(ir.node_attrs(pair.second).get("group", 1))
    r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
    per_group = w2.shape[0] // groups
    grouped = np.abs(w2).reshape(groups, per_group, w2.shape[1], -1)
    r2 = grouped.max(axis=(1, 3)).reshape(-1)  # channel g * (C/G) + c
    return r1, r2, groups


def _equalize_pair(weights: dict[str, np.ndarray], pair: ConvPair) -> float:
    """Scale one pair in ``weights``; returns how far the scales were from 1 (log ratio)."""
    r1, r2, groups = _ranges(weights, pair)
    alive = (r1 > 0) & (r2 > 0)
    scale = np.ones_like(r1)
    scale[alive] = np.sqrt(r1[alive] / r2[alive])
    scale = np.clip(scale, *SCALE_LIMITS)
    w1_name, w2_name = pair.first.input[1], pair.second.input[1]
    w1 = weights[w1_name]
    weights[w1_name] = w1 / scale.reshape(-1, *([1] * (w1.ndim - 1)))
    if len(pair.first.input) > 2 and pair.first.input[2]:
        weights[pair.first.input[2]] = weights[pair.first.input[2]] / scale
    w2 = weights[w2_name]
    per_group = w2.shape[0] // groups
    grouped = w2.reshape(groups, per_group, w2.shape[1], *w2.shape[2:])
    factor = scale.reshape(groups, 1, w2.shape[1], *([1] * (w2.ndim - 2)))
    weights[w2_name] = (grouped * factor).reshape(w2.shape)
    return float(np.abs(np.log(scale)).max(initial=0.0))


def _spread(weights: dict[str, np.ndarray], pair: ConvPair) -> float:
    """How unequal the pair's channels are: the largest over the smallest per-channel ratio
    ``r1_i / r2_i`` (1 once equalized)."""
    r1, r2, _ = _ranges(weights, pair)
    alive = (r1 > 0) & (r2 > 0)
    if not alive.any():
        return 1.0
    ratio = r1[alive] / r2[alive]
    return float(ratio.max() / ratio.min())
