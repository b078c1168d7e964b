"""Multiply-adds of a weighted layer, per sample, from the graph's inferred shapes: what the
accuracy target's search (``onnxq.mixed``) weighs layers by and the report's precision split
counts."""

from __future__ import annotations

import math
from typing import Any

import onnx
from onnx import helper

from onnxq import ir


def static_shape(shape: tuple[int | str | None, ...] | None) -> list[int] | None:
    """The shape with its first (batch) axis as 1, when the other axes are static."""
    if shape is None or not shape or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    return [1, *(int(d) for d in shape[1:])]  # type: ignore[arg-type]


def layer_macs(graph: ir.Graph, node: onnx.NodeProto) -> int | None:
    """Multiply-adds per sample of a Conv/ConvTranspose/Gemm/MatMul (the first axis of its
    output is the batch), or None when a shape is not static."""
    out = static_shape(graph.shape(node.output[0]))
    x = static_shape(graph.shape(node.input[0]))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    w = static_shape(graph.shape(node.input[1])) if len(node.input) > 1 else None
    if out is None:
        return None
    per_output: int | None
    if node.op_type == "Conv" and w is not None:
        per_output = math.prod(w[1:])
    elif node.op_type == "ConvTranspose" and w is not None and x is not None:
        return math.prod(x[1:]) * math.prod(w[1:])
    elif node.op_type in ("Gemm", "MatMul"):
        per_output = _reduction(graph, node, x, attrs)
    else:
        return None
    return None if per_output is None else math.prod(out[1:]) * per_output


def _reduction(
    graph: ir.Graph, node: onnx.NodeProto, x: list[int] | None, attrs: dict[str, Any]
) -> int | None:
    """The products a Gemm/MatMul sums per output value: from its left input's shape, else
    from a constant right-hand side's (a flattened input whose width shape inference lost)."""
    if x is not None:
        return x[0] if node.op_type == "Gemm" and attrs.get("transA", 0) else x[-1]
    w = graph.shape(node.input[1]) if graph.is_const(node.input[1]) else None
    if w is None or len(w) < 2 or not all(isinstance(d, int) and d > 0 for d in w):
        return None
    trans_b = node.op_type == "Gemm" and attrs.get("transB", 0)
    return int(w[-1] if trans_b else w[-2])  # type: ignore[arg-type]


__all__ = ["layer_macs", "static_shape"]
