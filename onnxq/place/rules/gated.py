"""Outlier channels of a gated linear unit's output, found from the weights alone.

A SwiGLU feed-forward block computes ``h = SiLU(x W_gate) * (x W_up)`` and its down projection
reads ``h``.  In language models a few channels of ``h`` carry values hundreds of times larger
than the rest on a few tokens (smollm2_135m: 2900 against a typical per-token maximum of 1.5 in
layer 11, on the first token).  A dynamic kernel quantizes ``h`` with one scale per tensor at
run time, so those values round every other value to zero.  The channels are where both
``W_gate`` and ``W_up`` have a large column (after the RMSNorm gain ``x`` was scaled by): their
product of column norms stands out from the median.  Those channels are computed in float beside
the kernel (``onnxq.materialize.dynamic``); the rest is quantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from onnxq import ir

# ops a gate's factor passes through between its MatMul and the product (SiLU = g * Sigmoid(g))
_GATE_PATH_OPS = frozenset({"Mul", "Sigmoid", "Tanh", "Relu", "Gelu", "Erf", "Div", "Add"})


@dataclass(frozen=True)
class OutlierSplit:
    """Which channels of a gated product are computed in float: those whose weight score
    (``|g_scale * W_gate[:, j]| * |g_scale * W_up[:, j]|``) is more than ``ratio`` times the
    median score, at most ``most`` per projection (the largest)."""

    ratio: float
    most: int


def outlier_channels(
    graph: ir.Graph, node: onnx.NodeProto, split: OutlierSplit
) -> np.ndarray | None:
    """The sorted input channels of ``node`` (a MatMul reading a gated product) that
    ``split`` keeps float, or None when the two MatMuls that make the product are not found."""
    product = graph.producer.get(node.input[0])
    if product is None or product.op_type != "Mul":
        return None
    factors = [t for t in product.input if t and not graph.is_const(t)]
    found = [_source_matmul(graph, t, 4) for t in factors]
    sources = [s for s in found if s is not None]
    if len(factors) != 2 or len(sources) != 2:
        return None
    weight = graph.const_info(node.input[1])
    columns = None if weight is None else weight.shape[0]
    scores = []
    for source in sources:
        w = graph.const_value(source.input[1])
        if w is None or w.ndim != 2 or w.shape[1] != columns:
            return None
        gain = _input_gain(graph, source.input[0], w.shape[0])
        scores.append(np.linalg.norm(w.astype(np.float64) * gain[:, None], axis=0))
    score = scores[0] * scores[1]
    median = float(np.median(score))
    if not median > 0:
        return np.zeros(0, np.int64)
    top = np.argsort(-score, kind="stable")[: split.most]
    return np.sort(top[score[top] > split.ratio * median]).astype(np.int64)


def _source_matmul(graph: ir.Graph, tensor: str, depth: int) -> onnx.NodeProto | None:
    """The MatMul with a constant 2-D weight ``tensor`` comes from, through a gate's
    elementwise ops (SiLU's ``g * Sigmoid(g)``), or None."""
    node = graph.producer.get(tensor)
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or depth == 0:
        return None
    if node.op_type == "MatMul":
        weight = graph.const_info(node.input[1])
        return node if weight is not None and weight.ndim == 2 else None
    if node.op_type not in _GATE_PATH_OPS:
        return None
    for live in (t for t in node.input if t and not graph.is_const(t)):
        found = _source_matmul(graph, live, depth - 1)
        if found is not None:
            return found
    return None


def _input_gain(graph: ir.Graph, tensor: str, size: int) -> np.ndarray:
    """The constant per-channel gain ``tensor`` was multiplied by last (an RMSNorm's weight),
    or ones."""
    node = graph.producer.get(tensor)
    if node is not None and node.op_type == "Mul" and node.domain in ir.DEFAULT_DOMAINS:
        for name in node.input:
            value = graph.const_value(name) if graph.is_const(name) else None
            if value is not None and value.size == size and value.shape[-1:] == (size,):
                return np.abs(value.reshape(-1).astype(np.float64))
    return np.ones(size)


def linear_factor(graph: ir.Graph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The MatMul whose output is itself one factor of the gated product ``node`` reads (the
    up projection, not the gate behind its SiLU), when nothing else reads its output or its
    weight initializer: its weight columns can be rescaled without changing anything else."""
    product = graph.producer.get(node.input[0])
    if product is None:
        return None
    for factor in product.input:
        source = graph.producer.get(factor)
        if source is None or source.op_type != "MatMul" or source.domain not in ir.DEFAULT_DOMAINS:
            continue
        weight = source.input[1]
        readers = [r for r, _ in graph.consumers.get(factor, [])]
        alone = readers == [product] and factor not in graph.graph_outputs
        if alone and weight in graph.initializers and len(graph.consumers.get(weight, [])) == 1:
            return source
    return None
