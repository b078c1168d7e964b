"""Recognise the decomposed hardswish ``x * Clip(x + 3, 0, 6) / 6`` and fold it to fewer ops.

Exporters that predate ONNX's HardSwish (opset 14), PaddlePaddle's among them, write hardswish
as four elementwise ops: Add, Clip, Mul, Div (or a Mul by 1/6).  Each of them is a full pass over
the tensor, and none has an onnxruntime integer kernel except the Mul, so in a quantized model
they also need Q/DQ pairs between them.  The same function is

* ``HardSwish(x)`` from opset 14, one op;
* ``Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))`` at any opset >= 6, two ops:
  ``max(0, min(1, x/6 + 1/2)) = Clip(x + 3, 0, 6) / 6``.

Both are equal to the decomposition within float rounding.  The pass only fires when every
intermediate tensor is read by the pattern alone and is not a graph output.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir

_RTOL = 1e-5
HARDSWISH_OPSET = 14


def fuse_hardswish(graph: ir.Graph) -> bool:
    """Replace each decomposed hardswish with HardSwish (opset >= 14) or HardSigmoid + Mul."""
    opset = ir.opset_version(graph.model)
    matches = [m for n in graph.nodes if (m := _match(graph, n)) is not None]
    if not matches:
        return False
    plans = [(x, out, nodes[-1].name) for x, out, nodes in matches]
    graph.remove_nodes([node for _, _, nodes in matches for node in nodes])
    for x, out, name in plans:
        if opset >= HARDSWISH_OPSET:
            graph.add_node("HardSwish", [x], [out], graph.unique_name(f"{name}_hardswish"))
            continue
        gate = graph.unique_name(f"{out}_hardsigmoid")
        graph.add_node(
            "HardSigmoid",
            [x],
            [gate],
            graph.unique_name(f"{name}_hardsigmoid"),
            alpha=1.0 / 6.0,
            beta=0.5,
        )
        graph.add_node("Mul", [x, gate], [out], graph.unique_name(f"{name}_mul"))
    return True


def _match(
    graph: ir.Graph,
    last: onnx.NodeProto,
) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """``(x, output, nodes)`` when ``last`` ends a decomposed hardswish, else ``None``.

    Accepted shapes, with ``c = Clip(x + 3, 0, 6)`` and the operands of Add and Mul in either
    order: ``(x * c) / 6``, ``(x * c) * (1/6)``, ``x * (c / 6)`` and ``x * (c * (1/6))``.
    """
    if last.domain not in ir.DEFAULT_DOMAINS or last.op_type not in ("Div", "Mul"):
        return None
    if len(last.input) != 2:
        return None
    return _scaled_product(graph, last) or _product_of_scaled(graph, last)


def _scaled_product(
    graph: ir.Graph,
    last: onnx.NodeProto,
) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """``(x * c) / 6`` or ``(x * c) * (1/6)``."""
    product = _by_sixth(graph, last)
    inner = graph.producer.get(product) if product is not None else None
    if inner is None or inner.op_type != "Mul" or not _private(graph, product):  # type: ignore[arg-type]
        return None
    for x_index in (0, 1):
        x, c = inner.input[x_index], inner.input[1 - x_index]
        chain = _clip_of_x_plus_3(graph, c)
        if chain is not None and chain[0] == x and _private(graph, c):
            return x, last.output[0], [*chain[1], inner, last]
    return None


def _product_of_scaled(
    graph: ir.Graph,
    last: onnx.NodeProto,
) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """``x * (c / 6)`` or ``x * (c * (1/6))``."""
    if last.op_type != "Mul":
        return None
    for x_index in (0, 1):
        x, gate = last.input[x_index], last.input[1 - x_index]
        scale = graph.producer.get(gate)
        if scale is None or scale.op_type not in ("Div", "Mul") or not _private(graph, gate):
            continue
        c = _by_sixth(graph, scale)
        chain = _clip_of_x_plus_3(graph, c) if c is not None else None
        if chain is not None and chain[0] == x and _private(graph, c):  # type: ignore[arg-type]
            return x, last.output[0], [*chain[1], scale, last]
    return None


def _by_sixth(graph: ir.Graph, node: onnx.NodeProto) -> str | None:
    """The tensor that ``node`` divides by 6 (Div by 6, or Mul by 1/6 in either order)."""
    if len(node.input) != 2:
        return None
    if node.op_type == "Div":
        return node.input[0] if _scalar_is(graph, node.input[1], 6.0) else None
    for i in (0, 1):
        if _scalar_is(graph, node.input[1 - i], 1.0 / 6.0) and not graph.is_const(node.input[i]):
            return node.input[i]
    return None


def _clip_of_x_plus_3(
    graph: ir.Graph,
    tensor: str,
) -> tuple[str, list[onnx.NodeProto]] | None:
    """``(x, [add, clip])`` when ``tensor = Clip(x + 3, 0, 6)``."""
    clip = graph.producer.get(tensor)
    if clip is None or clip.op_type != "Clip" or clip.domain not in ir.DEFAULT_DOMAINS:
        return None
    attrs = ir.node_attrs(clip)
    low: object = attrs.get("min")
    high: object = attrs.get("max")
    if len(clip.input) > 1 and clip.input[1]:
        low = graph.const_value(clip.input[1])
    if len(clip.input) > 2 and clip.input[2]:
        high = graph.const_value(clip.input[2])
    if not (_is(low, 0.0) and _is(high, 6.0)):
        return None
    add = graph.producer.get(clip.input[0])
    if add is None or add.op_type != "Add" or not _private(graph, clip.input[0]):
        return None
    for i in (0, 1):
        if _scalar_is(graph, add.input[1 - i], 3.0) and not graph.is_const(add.input[i]):
            return add.input[i], [add, clip]
    return None


def _private(graph: ir.Graph, tensor: str) -> bool:
    """Read by exactly one node, and neither a graph output nor read by a subgraph."""
    return (
        len(graph.consumers.get(tensor, [])) == 1
        and tensor not in graph.graph_outputs
        and tensor not in graph.subgraph_reads
    )


def _scalar_is(graph: ir.Graph, tensor: str, value: float) -> bool:
    return graph.is_const(tensor) and _is(graph.const_value(tensor), value)


def _is(value: object, expected: float) -> bool:
    if value is None:
        return False
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind != "f":
        return False
    return bool(np.isclose(float(arr.reshape(())), expected, rtol=_RTOL, atol=0.0))
