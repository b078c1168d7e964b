"""Write a per-channel PRelu as ``Relu(x) + Min(x, 0) * slope``: the same values, 4-8x faster
in onnxruntime.

onnxruntime 1.31's CPU PRelu spends about 3.8 ns per element on a [1, 32, 46, 46] tensor with a
per-channel slope (262 us), where its Relu, Min, Mul and Add together spend 0.5 ns (35 us); on a
[1, 10, 10, 10] tensor both take about 5 us.  PRelu has no integer kernel either, so in a
quantized model it is a float island between DequantizeLinear and QuantizeLinear; the four ops
are too.  The rewrite is exact: for ``x > 0`` it adds ``x`` and ``0 * slope``, for ``x <= 0``
it adds ``0`` and ``x * slope``, which is PRelu's product (``-0.0`` aside).

Only a constant slope is rewritten, and only where the tensor is large enough for the kernel
to matter (``MIN_ELEMENTS`` per sample, static shapes): below that the one op is faster.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from onnxq import ir

MIN_ELEMENTS = 4096


def decompose_prelu(graph: ir.Graph) -> bool:
    """``PRelu(x, s)`` with a constant ``s`` becomes ``Add(Relu(x), Mul(Min(x, 0), s))``."""
    doomed = [n for n in graph.nodes if _rewritable(graph, n)]
    plans = [(n.name, n.input[0], n.input[1], n.output[0]) for n in doomed]
    if not plans:
        return False
    graph.remove_nodes(doomed)
    for name, x, slope, out in plans:
        dtype = graph.const_value(slope).dtype  # type: ignore[union-attr]
        zero = graph.add_initializer(graph.unique_name(f"{name}_zero"), np.zeros((), dtype))
        pos, neg, scaled = (graph.unique_name(f"{out}_{part}") for part in ("pos", "neg", "neg_s"))
        graph.add_node("Relu", [x], [pos], graph.unique_name(f"{name}_relu"))
        graph.add_node("Min", [x, zero], [neg], graph.unique_name(f"{name}_min"))
        graph.add_node("Mul", [neg, slope], [scaled], graph.unique_name(f"{name}_mul"))
        graph.add_node("Add", [pos, scaled], [out], graph.unique_name(f"{name}_add"))
    return True


def _rewritable(graph: ir.Graph, node: onnx.NodeProto) -> bool:
    if node.op_type != "PRelu" or node.domain not in ir.DEFAULT_DOMAINS or len(node.input) != 2:
        return False
    slope = graph.const_value(node.input[1])
    if slope is None or slope.dtype.kind != "f":
        return False
    shape = graph.shape(node.input[0])
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) for d in shape[1:]):
        return True  # dynamic: sized by the data at run time, where the one op costs most
    return math.prod(shape[1:]) >= MIN_ELEMENTS  # type: ignore[arg-type]
