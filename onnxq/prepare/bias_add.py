"""Fold a per-channel affine after a Conv into the Conv: ``Mul`` into its weight and bias,
``Add`` into its bias.

Exporters that keep the bias apart (PaddlePaddle's ``conv2d`` + ``elementwise_add``, a bias
added after a squeeze-and-excitation conv) write ``Conv(x, W) + b`` with ``b`` of shape
``[1, C, 1, 1]``; Caffe2 and frozen-batch-norm exports write a batch norm as
``Conv(x, W) * s + b``.  Each Mul or Add is one more pass over the tensor and, in a quantized
model, one more Q/DQ boundary: the Conv's integer kernel cannot absorb it, and TensorRT's
Q/DQ conv fusion stops there.  ``Conv(x, W * s, B * s + b)`` is the same function (float
rounding apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx

from onnxq import ir

_WITH_BIAS = ("Conv", "ConvTranspose")


def fold_bias_add(graph: ir.Graph) -> bool:
    """``Add(Conv(x, W[, B]), b)`` with a constant per-channel ``b`` becomes ``Conv(x, W, B+b)``."""
    return _fold_all(graph, _fold)


def fold_channel_mul(graph: ir.Graph) -> bool:
    """``Mul(Conv(x, W[, B]), s)`` with a constant per-channel vector ``s`` (not a scalar)
    becomes ``Conv(x, W * s, B * s)``."""
    return _fold_all(graph, _fold_mul)


def _fold_all(
    graph: ir.Graph, fold: Callable[[ir.Graph, onnx.NodeProto], onnx.NodeProto | None]
) -> bool:
    """Apply ``fold`` to every node; the nodes it folded away are removed."""
    doomed = [node for node in graph.nodes if fold(graph, node) is not None]
    graph.remove_nodes(doomed)
    return bool(doomed)


def _conv_operands(
    graph: ir.Graph,
    node: onnx.NodeProto,
    op_type: str,
) -> Iterator[tuple[int, onnx.NodeProto, np.ndarray]]:
    """(i, conv, c) for each way ``node`` (an ``op_type`` of two inputs) reads a Conv's output
    as input ``i``, which only it reads, and a per-channel constant ``c`` as the other."""
    if node.op_type != op_type or node.domain not in ir.DEFAULT_DOMAINS or len(node.input) != 2:
        return
    for i in (0, 1):
        conv = graph.producer.get(node.input[i])
        vector = _channel_vector(graph, node.input[1 - i], conv)
        if conv is not None and vector is not None and _sole_reader(graph, conv, node.input[i]):
            yield i, conv, vector


def _fold_mul(graph: ir.Graph, mul: onnx.NodeProto) -> onnx.NodeProto | None:
    """Fold ``mul`` into its producing Conv; returns the Conv, or ``None`` when it does not fit."""
    for i, conv, scale in _conv_operands(graph, mul, "Mul"):
        # a batch norm's scale varies per channel; one scalar for all channels (PP-LCNet's
        # learnable affine block) is left alone: folding it moves onnxruntime's output
        # quantization past the affine, which cost PP-OCRv4 det and rec accuracy (measured)
        if graph.const_value(mul.input[1 - i]).size == 1:  # type: ignore[union-attr]
            continue
        weight = graph.const_value(conv.input[1])
        old = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
        bias = graph.const_value(old) if old else None
        if weight is None or (old and (bias is None or bias.shape != scale.shape)):
            continue
        scaled = scaled_weight(conv, weight.astype(np.float64), scale.astype(np.float64))
        if scaled is None:
            continue
        conv.input[1] = graph.add_initializer(
            graph.unique_name(f"{conv.input[1]}_mul"), scaled.astype(weight.dtype)
        )
        if old:
            assert bias is not None
            conv.input[2] = graph.add_initializer(
                graph.unique_name(f"{conv.name}_bias_mul"),
                (bias.astype(np.float64) * scale).astype(bias.dtype),
            )
        conv.output[0] = mul.output[0]
        return conv
    return None


def _sole_reader(graph: ir.Graph, conv: onnx.NodeProto, out: str) -> bool:
    """True when ``out`` is ``conv``'s output and read by one node only (not by a subgraph, not
    a graph output): the Conv may then produce the reader's tensor instead."""
    return (
        len(graph.consumers.get(out, [])) == 1
        and out not in graph.graph_outputs
        and out not in graph.subgraph_reads
        and out == conv.output[0]
    )


def scaled_weight(node: onnx.NodeProto, w: np.ndarray, scale: np.ndarray) -> np.ndarray | None:
    """``w``, the weight of Conv/ConvTranspose/Gemm (or MatMul: a Gemm without attributes)
    ``node``, with output channel ``k`` multiplied by ``scale[k]``; ``None`` when the shapes do
    not fit."""
    attrs = ir.node_attrs(node)
    if node.op_type == "Conv":
        if w.shape[0] != len(scale):
            return None
        return w * scale.reshape(-1, *([1] * (w.ndim - 1)))
    if node.op_type == "ConvTranspose":
        group = int(attrs.get("group", 1))
        c_in, c_out_g = w.shape[0], w.shape[1]
        if c_out_g * group != len(scale):
            return None
        grouped = w.reshape(group, c_in // group, c_out_g, *w.shape[2:])
        s = scale.reshape(group, 1, c_out_g, *([1] * (w.ndim - 2)))
        return (grouped * s).reshape(w.shape)
    # Gemm: only the plain y = A B' + C form folds exactly
    if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or w.ndim != 2:
        return None
    if attrs.get("transB", 0):
        return w * scale[:, None] if w.shape[0] == len(scale) else None
    return w * scale[None, :] if w.shape[1] == len(scale) else None


def _fold(graph: ir.Graph, add: onnx.NodeProto) -> onnx.NodeProto | None:
    """Fold ``add`` into its producing Conv; returns the Conv, or ``None`` when it does not fit."""
    for _, conv, bias in _conv_operands(graph, add, "Add"):
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


def _channel_vector(
    graph: ir.Graph,
    tensor: str,
    conv: onnx.NodeProto | None,
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
    channels = (
        weight.shape[0]
        if conv.op_type == "Conv"
        else weight.shape[1] * int(ir.node_attrs(conv).get("group", 1))
    )
    if value.ndim > rank:
        return None
    dims = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(dims) if k != 1) or dims[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(weight.dtype)
