"""Layers of one kind kept float together: the starts the ``--target-max-float-macs`` search
tries besides the empty set.

The greedy of :mod:`onnxq.float_cost` adds one layer at a time, each judged by what it gains
on its own given the layers already float.  Where the error is spread over many small layers
of one kind, each of them gains little alone and the greedy spends its ceiling elsewhere,
although together they gain most: on mobilenet_v2 (``tensorrt``, prefix ranges, depthwise
equalization) the 16 depthwise convs float together with ``features.1``'s projection conv
(9.0% of the multiply-adds, with the profile's float first conv) score 0.9968 on the held-out
batches with AdaRound's weights, where the greedy's 6 layers within 10% score 0.9950
(docs/mixed_precision.md).

So :func:`choose_within <onnxq.float_budget.choose_within>` also starts the greedy from each
*group* that fits the ceiling: the candidates of one structural kind (:func:`layer_kind`:
depthwise, pointwise, spatial or grouped Conv, ConvTranspose, Gemm, MatMul), at least
:data:`MIN_GROUP` of them.  A group costs one trial, and the greedy from it its own trials
(the scored sets are shared).  The scored sets of every start are then compared as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onnxq import ir

if TYPE_CHECKING:
    from onnxq.sensitivity import LayerSensitivity

# fewer layers than this of one kind are not tried as a group (the greedy tries pairs)
MIN_GROUP = 3


def layer_kind(graph: ir.Graph, name: str) -> str | None:
    """The structural kind of layer ``name``: ``depthwise`` (one input channel per group, as
    many groups as input channels), ``grouped``, ``pointwise`` (1x1), ``spatial`` Conv, else
    its op type; None: not a node of ``graph``."""
    node = graph.node_by_name(name)
    if node is None:
        return None
    if node.op_type != "Conv":
        return node.op_type
    weight = graph.shape(node.input[1]) if len(node.input) > 1 else None
    group = int(ir.node_attrs(node).get("group", 1))
    if weight is None or not all(isinstance(d, int) for d in weight) or len(weight) < 3:
        return "grouped" if group > 1 else "conv"
    if group > 1:
        return "depthwise" if weight[1] == 1 and group == weight[0] else "grouped"
    return "pointwise" if all(d == 1 for d in weight[2:]) else "spatial"


def kind_groups(
    graph: ir.Graph, ranking: Sequence[LayerSensitivity]
) -> list[list[LayerSensitivity]]:
    """The candidates of ``ranking`` grouped by :func:`layer_kind`, groups of at least
    :data:`MIN_GROUP` layers, each in ``ranking``'s order; the groups in the order of their
    kind's name."""
    groups: dict[str, list[LayerSensitivity]] = {}
    for layer in ranking:
        kind = layer_kind(graph, layer.node)
        if kind is not None:
            groups.setdefault(kind, []).append(layer)
    return [groups[kind] for kind in sorted(groups) if len(groups[kind]) >= MIN_GROUP]


__all__ = ["MIN_GROUP", "kind_groups", "layer_kind"]
