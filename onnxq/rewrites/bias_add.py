"""Fold an ``Add`` of a per-channel constant after a Conv into the Conv's bias.

Exporters that keep the bias apart (PaddlePaddle's ``conv2d`` + ``elementwise_add``, a bias
added after a squeeze-and-excitation conv) write ``Conv(x, W) + b`` with ``b`` of shape
``[1, C, 1, 1]``.  The Add is one more pass over the tensor and, in a quantized model, one more
Q/DQ boundary: the Conv's integer kernel cannot absorb it.  ``Conv(x, W, B + b)`` is the same
function (one float rounding of ``B + b`` apart).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir

_WITH_BIAS = ("Conv", "ConvTranspose")


def fold_bias_add(graph: ir.Graph) -> bool:
    """``Add(Conv(x, W[, B]), b)`` with a constant per-channel ``b`` becomes ``Conv(x, W, B+b)``."""
    doomed = []
    for add in graph.nodes:
        folded = _fold(graph, add)
        if folded is not None:
            doomed.append(add)
    graph.remove_nodes(doomed)
    return bool(doomed)


def _fold(graph: ir.Graph, add: onnx.NodeProto) -> onnx.NodeProto | None:
    """Fold ``add`` into its producing Conv; returns the Conv, or ``None`` when it does not fit."""
    if add.op_type != "Add" or add.domain not in ir.DEFAULT_DOMAINS or len(add.input) != 2:
        return None
    for i in (0, 1):
        conv = graph.producer.get(add.input[i])
        bias = _channel_vector(graph, add.input[1 - i], conv)
        if conv is None or bias is None:
            continue
        out = add.input[i]
        if (len(graph.consumers.get(out, [])) != 1 or out in graph.graph_outputs
                or out in graph.subgraph_reads or out != conv.output[0]):
            continue
        old = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
        base = graph.const_value(old) if old else np.zeros_like(bias)
        if base is None or base.shape != bias.shape or base.dtype != bias.dtype:
            continue
        name = graph.add_initializer(graph.unique_name(f"{conv.name}_bias_add"), base + bias)
        if old:
            conv.input[2] = name
        else:
            conv.input.append(name)
        conv.output[0] = add.output[0]
        return conv
    return None


def _channel_vector(graph: ir.Graph, tensor: str, conv: onnx.NodeProto | None,
                    ) -> np.ndarray | None:
    """``tensor`` as a ``[C]`` bias for ``conv``'s output, if it only varies along channels."""
    if conv is None or conv.op_type not in _WITH_BIAS or conv.domain not in ir.DEFAULT_DOMAINS:
        return None
    value = graph.const_value(tensor) if graph.is_const(tensor) else None
    weight = graph.const_value(conv.input[1]) if len(conv.input) > 1 else None
    shape = graph.shape(conv.output[0])
    if value is None or weight is None or shape is None or value.dtype != weight.dtype:
        return None
    rank = len(shape)
    channels = (weight.shape[0] if conv.op_type == "Conv"
                else weight.shape[1] * int(ir.node_attrs(conv).get("group", 1)))
    if value.ndim > rank:
        return None
    dims = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(dims) if k != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(weight.dtype)
