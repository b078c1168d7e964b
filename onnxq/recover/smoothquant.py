"""SmoothQuant: move the activation outliers of MatMul/Gemm inputs into the weights (Xiao et
al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language
Models", 2023).

A transformer's MatMul input ``X`` (``[..., K]``) has a few channels whose values are 10-100x
the others; one per-tensor int8 scale then leaves the ordinary channels a handful of levels.
``X W = (X / s) (s W)`` for any positive per-channel ``s``: with ``s_j = max|X_j|^alpha /
max|W_j|^(1 - alpha)`` (``W_j``: row ``j`` of every weight that reads ``X``) the activation's
channels come closer together and the weights, quantized per output channel, take part of
their spread.  ``max|X_j|`` is measured on the calibration data.

The division by ``s`` is folded where that is exact, into the op that produces ``X`` when
only the smoothed MatMuls read it: the constant of a ``Mul`` (an RMSNorm's weight), a
``LayerNormalization``'s scale and bias, the output columns (and bias) of a MatMul or Gemm
with a constant weight, or one factor of a product of two activations (a SwiGLU's up
projection).  Elsewhere a ``Mul`` by ``1 / s`` is inserted before the MatMuls: exact too, at
the cost of one elementwise op.  The float model's function does not change (float rounding
apart); the report lists each smoothed tensor, how it was folded, and its channel spread
before and after.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import Batch, InputSpec
from onnxq.recover.capture import channel_peaks
from onnxq.recover.layers import LinearLayer, linear_layer

SCALE_LIMITS = (1e-5, 1e5)
SHAPE_READERS = frozenset({"Shape", "Size"})
DEFAULT_ALPHA = 0.8  # measured: see docs/accuracy.md (0.5 made all_minilm_l6_v2 worse)


@dataclass(frozen=True)
class Smoothed:
    """One smoothed MatMul/Gemm input."""

    tensor: str
    readers: tuple[str, ...]
    folded_into: str  # how the 1/s went in: "Mul constant <name>", "inserted Mul", ...
    channels: int
    spread_before: float  # max over channels of max|X_j| / median over channels
    spread_after: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class _Target:
    tensor: str
    layers: tuple[LinearLayer, ...]


def smooth(
    model: onnx.ModelProto,
    tensors: Iterable[str],
    data: Iterable[Batch],
    inputs: list[InputSpec],
    alpha: float = DEFAULT_ALPHA,
    max_batches: int | None = None,
    progress: bool = True,
    min_spread: float = 1.0,
) -> tuple[onnx.ModelProto, list[Smoothed]]:
    """Smooth the activations ``tensors`` (MatMul/Gemm inputs that will be quantized) of
    ``model`` (edited in place; returned with shapes inferred again) and report each one;
    a tensor whose channel peaks spread less than ``min_spread`` (largest / median) is left
    alone: it has no outlier channels to migrate."""
    graph = ir.Graph(model)
    targets = [t for name in tensors if (t := _target(graph, name)) is not None]
    if not targets:
        return model, []
    peaks = channel_peaks(
        model, [t.tensor for t in targets], data, inputs, axis=-1, label="smoothing",
        max_batches=max_batches, progress=progress,
    )  # fmt: skip
    done: list[Smoothed] = []
    for target in targets:
        peak = peaks[target.tensor]
        if _spread(peak) < min_spread:
            continue
        scale = _scales(graph, target, peak, alpha)
        how = _fold(graph, target, 1.0 / scale)
        for layer in target.layers:
            _scale_rows(graph, layer, scale)
        done.append(
            Smoothed(
                target.tensor,
                tuple(layer.node for layer in target.layers),
                how,
                int(peak.size),
                _spread(peak),
                _spread(peak / scale),
            )
        )
    if not done:
        return model, []
    graph.commit()
    return ir.infer_shapes(graph.model), done


# ------------------------------------------------------------------------------- targets
def _target(graph: ir.Graph, tensor: str) -> _Target | None:
    """The MatMul/Gemm layers with constant 2-D weights that read ``tensor`` as input 0, when
    every reader of it is one and their weights are their own; else None."""
    readers = graph.consumers.get(tensor, [])
    layers = []
    for node, index in readers:
        layer = linear_layer(graph, node) if node.op_type in ("MatMul", "Gemm") else "other"
        if isinstance(layer, str) or index != 0 or layer.trans_a:
            continue
        if len(graph.consumers.get(layer.weight, [])) != 1:
            continue
        layers.append(layer)
    if not layers:
        return None
    shape = graph.shape(tensor)
    k = layers[0].row_length
    if any(layer.row_length != k for layer in layers):
        return None
    if shape is not None and isinstance(shape[-1], int) and shape[-1] != k:
        return None
    return _Target(tensor, tuple(layers))


def _scales(graph: ir.Graph, target: _Target, peak: np.ndarray, alpha: float) -> np.ndarray:
    rows = np.zeros_like(peak)
    for layer in target.layers:
        w = graph.const_value(layer.weight)
        assert w is not None
        rows = np.maximum(rows, np.abs(layer.matrix(w)[0]).max(axis=0))
    alive = (peak > 0) & (rows > 0) & np.isfinite(peak)
    scale = np.ones_like(peak)
    scale[alive] = peak[alive] ** alpha / rows[alive] ** (1.0 - alpha)
    return np.clip(scale, *SCALE_LIMITS)


def _spread(peak: np.ndarray) -> float:
    median = float(np.median(peak))
    return float(peak.max() / median) if median > 0 else float("inf")


def _scale_rows(graph: ir.Graph, layer: LinearLayer, scale: np.ndarray) -> None:
    """Multiply the weight row of each input channel ``j`` by ``scale[j]`` (in place: the
    weight is the layer's own, and another target may have scaled its columns already)."""
    _scale_weight(graph, layer, scale[None, None, :])


def _scale_weight(graph: ir.Graph, layer: LinearLayer, factor: np.ndarray) -> None:
    node = graph.node_by_name(layer.node)
    assert node is not None
    w = graph.const_value(node.input[1])
    assert w is not None
    matrix = layer.matrix(w.astype(np.float64)) * factor
    graph.set_initializer(node.input[1], layer.from_matrix(matrix).astype(w.dtype))


# ------------------------------------------------------------------------------- folding
def _fold(graph: ir.Graph, target: _Target, inverse: np.ndarray) -> str:
    """Make ``target.tensor`` come out multiplied by ``inverse`` per last-axis channel; says
    how."""
    readers = {layer.node for layer in target.layers}
    sole = set(_value_readers(graph, target.tensor)) <= readers
    if sole and target.tensor not in graph.graph_outputs:
        how = _fold_into_producer(graph, target.tensor, inverse, depth=2)
        if how:
            return how
    return _insert_mul(graph, target, inverse)


def _fold_into_producer(graph: ir.Graph, tensor: str, inverse: np.ndarray, depth: int) -> str:
    node = graph.producer.get(tensor)
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or depth <= 0:
        return ""
    if node.op_type == "LayerNormalization":
        return _fold_layernorm(graph, node, inverse)
    if node.op_type in ("MatMul", "Gemm"):
        return _fold_columns(graph, node, inverse)
    if node.op_type == "Add":
        return _fold_bias_add(graph, node, inverse)
    if node.op_type == "Mul" and len(node.input) == 2:
        const = [i for i in (0, 1) if graph.is_const(node.input[i])]
        if len(const) == 1:
            return _fold_constant(graph, node, const[0], inverse)
        for i in (0, 1):  # a product of two activations: scale one factor
            factor = node.input[i]
            if _value_readers(graph, factor) == [node.name] and factor not in graph.graph_outputs:
                how = _fold_into_producer(graph, factor, inverse, depth - 1)
                if how:
                    return f"{how} (a factor of {node.name})"
    return ""


def _value_readers(graph: ir.Graph, tensor: str) -> list[str]:
    """The nodes that read ``tensor``'s values; a ``Shape`` or ``Size`` reads only its shape,
    which scaling leaves alone (Hugging Face attention reads ``hidden_states.shape``)."""
    return [n.name for n, _ in graph.consumers.get(tensor, []) if n.op_type not in SHAPE_READERS]


def _fold_constant(graph: ir.Graph, node: onnx.NodeProto, index: int, inverse: np.ndarray) -> str:
    const = graph.const_value(node.input[index])
    if (
        const is None
        or const.dtype != np.float32
        or const.shape[-1:] not in ((inverse.size,), (1,))
    ):
        return ""
    if const.ndim > 1 and const.size != const.shape[-1]:
        return ""  # varies along other axes too
    value = (const.astype(np.float64) * inverse).astype(np.float32)
    name = graph.unique_name(f"{node.input[index]}_smoothed")
    graph.add_initializer(name, value.reshape(*const.shape[:-1], inverse.size))
    graph.set_input(node, index, name)
    return f"Mul constant of {node.name}"


def _fold_layernorm(graph: ir.Graph, node: onnx.NodeProto, inverse: np.ndarray) -> str:
    axis = int(ir.node_attrs(node).get("axis", -1))
    rank = len(graph.shape(node.input[0]) or ())
    if axis not in (-1, rank - 1) or any(node.output[1:]):
        return ""
    for index in (1, 2):
        if len(node.input) <= index or not node.input[index]:
            continue
        value = graph.const_value(node.input[index])
        if value is None or value.shape != inverse.shape:
            return ""
    for index in (1, 2):
        if len(node.input) > index and node.input[index]:
            value = graph.const_value(node.input[index])
            assert value is not None
            name = graph.unique_name(f"{node.input[index]}_smoothed")
            graph.add_initializer(name, (value.astype(np.float64) * inverse).astype(value.dtype))
            graph.set_input(node, index, name)
    return f"scale and bias of {node.name}"


def _fold_columns(graph: ir.Graph, node: onnx.NodeProto, inverse: np.ndarray) -> str:
    """Scale the output columns (and a Gemm's bias) of a layer with a weight of its own."""
    layer = linear_layer(graph, node)
    if isinstance(layer, str) or layer.outputs != inverse.size:
        return ""
    if len(graph.consumers.get(layer.weight, [])) != 1:
        return ""
    c = None
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        c = graph.const_value(node.input[2])
        if c is None or c.size not in (1, inverse.size):
            return ""
    _scale_weight(graph, layer, inverse[None, :, None])
    if c is not None:
        scaled = np.broadcast_to(c.reshape(-1), inverse.shape) * inverse
        c_name = graph.unique_name(f"{node.input[2]}_smoothed")
        graph.add_initializer(c_name, scaled.astype(c.dtype))
        graph.set_input(node, 2, c_name)
    return f"output columns of {node.name}"


def _fold_bias_add(graph: ir.Graph, add: onnx.NodeProto, inverse: np.ndarray) -> str:
    """``Add(MatMul(A, W), b)``: scale W's columns and ``b``."""
    if len(add.input) != 2:
        return ""
    for i in (0, 1):
        bias = graph.const_value(add.input[1 - i])
        producer = graph.producer.get(add.input[i])
        if (
            bias is None
            or bias.shape[-1:] != (inverse.size,)
            or bias.size != inverse.size
            or producer is None
            or producer.op_type != "MatMul"
            or [n.name for n, _ in graph.consumers.get(add.input[i], [])] != [add.name]
        ):
            continue
        how = _fold_columns(graph, producer, inverse)
        if not how:
            return ""
        name = graph.unique_name(f"{add.input[1 - i]}_smoothed")
        graph.add_initializer(
            name, (bias.astype(np.float64) * inverse.reshape(bias.shape)).astype(bias.dtype)
        )
        graph.set_input(add, 1 - i, name)
        return f"{how} and the bias of {add.name}"
    return ""


def _insert_mul(graph: ir.Graph, target: _Target, inverse: np.ndarray) -> str:
    factor = graph.add_initializer(
        graph.unique_name(f"{target.tensor}_smooth_scale"), inverse.astype(np.float32)
    )
    out = graph.unique_name(f"{target.tensor}_smoothed")
    node = graph.add_node("Mul", [target.tensor, factor], [out], graph.unique_name(f"{out}_Mul"))
    for layer in target.layers:
        reader = graph.node_by_name(layer.node)
        assert reader is not None
        graph.set_input(reader, 0, out)
    return f"inserted {node.name}"
