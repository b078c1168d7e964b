"""Input scales of weight-only layers (AWQ), written by :mod:`onnxq.materialize.blocked`.

A layer group whose weights were stored as ``s W`` must read ``x / s``.  When only these layers
read ``x``, the division is folded into the constant of the Mul that produces ``x`` (an RMSNorm's
weight as exporters write it) or into the scale and bias of a LayerNormalization; otherwise one
Mul node per input tensor is added before them.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir


def scaled_input(
    graph: ir.Graph,
    node: onnx.NodeProto,
    input_scale: np.ndarray,
    ours: set[str],
    done: dict[tuple[str, bytes], str],
) -> str:
    """The input of ``node`` divided by ``input_scale``: folded into the constant of the Mul
    that makes it when only ``ours`` (the layers stored with this scale) read it, else through
    one new Mul; ``done`` remembers what was written per (input, scale)."""
    x = node.input[0]
    scale = np.asarray(input_scale, np.float32)
    key = (x, scale.tobytes())
    if key in done:
        return done[key]
    readers = {n.name for n, _ in graph.consumers.get(x, [])}
    folded = readers <= ours and (
        _fold_into_mul(graph, x, scale) or _fold_into_layer_norm(graph, x, scale)
    )
    if folded:
        done[key] = x
        return x
    inv = graph.add_initializer(
        graph.unique_name(f"{x}_awq_scale"), (1.0 / scale).astype(np.float32)
    )
    out = graph.unique_name(f"{x}_awq")
    graph.add_node("Mul", [x, inv], [out], graph.unique_name(f"{x}_awq_Mul"))
    done[key] = out
    return out


def _fold_into_mul(graph: ir.Graph, x: str, scale: np.ndarray) -> bool:
    """Divide the constant operand of the Mul producing ``x`` by ``scale`` (channel-wise, last
    axis), if it has one of shape ``[K]`` (or ``[1, ..., K]``) that nothing else reads."""
    producer = graph.producer.get(x)
    if producer is None or producer.op_type != "Mul" or producer.domain not in ir.DEFAULT_DOMAINS:
        return False
    for i in (0, 1):
        name = producer.input[i]
        value = graph.const_value(name) if name in graph.initializers else None
        if value is None or value.dtype != np.float32 or value.shape[-1:] != scale.shape:
            continue
        if any(d != 1 for d in value.shape[:-1]) or len(graph.consumers.get(name, [])) != 1:
            continue
        graph.set_initializer(name, (value / scale).astype(np.float32))
        return True
    return False


def _fold_into_layer_norm(graph: ir.Graph, x: str, scale: np.ndarray) -> bool:
    """Divide the scale and bias of the LayerNormalization producing ``x`` (over its last
    axis) by ``scale``, if they are constant vectors of size K that nothing else reads."""
    producer = graph.producer.get(x)
    if (
        producer is None
        or producer.op_type != "LayerNormalization"
        or producer.domain not in ir.DEFAULT_DOMAINS
        or int(ir.node_attrs(producer).get("axis", -1)) != -1
        or producer.output[0] != x
    ):
        return False
    params = [name for name in producer.input[1:3] if name]
    values = [graph.const_value(name) if name in graph.initializers else None for name in params]
    for name, value in zip(params, values, strict=True):
        if value is None or value.dtype != np.float32 or value.shape != scale.shape:
            return False
        if len(graph.consumers.get(name, [])) != 1:
            return False
    for name, value in zip(params, values, strict=True):
        assert value is not None
        graph.set_initializer(name, (value / scale).astype(np.float32))
    return True
