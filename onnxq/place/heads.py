"""A model's heads: the weighted ops its outputs are read from through data movement alone,
and the outputs that hold per-element sigmoid scores.  Their ranges are read at the extremes
(a profile's ``head_method``)."""

from __future__ import annotations

import onnx

from onnxq import ir
from onnxq.ir.ops import WEIGHTED_OPS

# ops a model's output is read through after its last weighted layer: they move, select or
# squash values without mixing them (a binary op counts when its other input is a constant);
# Resize interpolates neighbours of one channel (a score map upsampled to the input's size)
HEAD_PATH_OPS = frozenset(
    [
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
        "Resize",
    ]
)
# head-path ops whose inputs after the first are shapes, indices, sizes or bounds
DATA_FIRST_OPS = frozenset(
    ["Reshape", "Slice", "Gather", "Split", "Squeeze", "Unsqueeze", "Clip", "Resize"]
)


def _weighted(node: onnx.NodeProto) -> bool:
    return node.domain in ir.DEFAULT_DOMAINS and node.op_type in WEIGHTED_OPS


def _head_path_step(graph: ir.Graph, node: onnx.NodeProto | None) -> list[str]:
    """The tensors a walk up from an output continues to through ``node`` (none at a
    weighted op, which ends a head path, or at an op that mixes values)."""
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or node.op_type not in HEAD_PATH_OPS:
        return []  # a weighted op ends the path, an op not listed mixes values
    if node.op_type in DATA_FIRST_OPS:
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
    such model measured (git: docs/benchmarks.md)."""
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
