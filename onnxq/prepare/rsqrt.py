"""Write a multiplication by ``Reciprocal(Sqrt(v))`` as a division by ``Sqrt(v)``.

torch's dynamo exporter writes ``rsqrt`` as ``Reciprocal(Sqrt(v))``, so an RMSNorm
(``x * rsqrt(mean(x^2) + eps) * w``, every Llama-style decoder) arrives as Pow, ReduceMean,
Add, Sqrt, Reciprocal, Mul, Mul.  onnxruntime fuses RMSNorm into one kernel
(``SimplifiedLayerNormalization``) only when the normalisation is a ``Div`` by the ``Sqrt``:
smollm2_135m has 61 of them, 366 ops of its 1776 after onnxruntime's own fusions.  The
division is the same function with one rounding instead of two (``x / s`` is correctly
rounded; ``x * (1 / s)`` rounds twice), so outputs agree within float rounding.

The pass fires only where every reader of the reciprocal is a ``Mul`` of two tensors and the
reciprocal is not a graph output or read inside a subgraph; the ``Reciprocal`` then goes.
"""

from __future__ import annotations

import onnx

from onnxq import ir


def reciprocal_sqrt_to_div(graph: ir.Graph) -> bool:
    """Each ``Mul(x, Reciprocal(Sqrt(v)))`` becomes ``Div(x, Sqrt(v))``; True if any did."""
    doomed = []
    for node in graph.nodes:
        readers = _readers(graph, node)
        if readers is None:
            continue
        root = node.input[0]
        for mul in readers:
            other = mul.input[1] if mul.input[0] == node.output[0] else mul.input[0]
            mul.op_type = "Div"
            graph.set_input(mul, 0, other)
            graph.set_input(mul, 1, root)
        doomed.append(node)
    graph.remove_nodes(doomed)
    return bool(doomed)


def _readers(graph: ir.Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The Muls reading ``node`` when it is a default-domain ``Reciprocal`` of a ``Sqrt``
    whose every reader is a two-input Mul by another tensor, else None."""
    if node.op_type != "Reciprocal" or node.domain not in ir.DEFAULT_DOMAINS:
        return None
    source = graph.producer.get(node.input[0])
    if source is None or source.op_type != "Sqrt" or source.domain not in ir.DEFAULT_DOMAINS:
        return None
    out = node.output[0]
    if out in graph.graph_outputs or out in graph.subgraph_reads:
        return None
    readers = [reader for reader, _ in graph.consumers.get(out, [])]
    if not readers:
        return None
    for mul in readers:
        if (
            mul.op_type != "Mul"
            or mul.domain not in ir.DEFAULT_DOMAINS
            or len(mul.input) != 2
            or mul.input[0] == mul.input[1]
        ):
            return None
    return readers
