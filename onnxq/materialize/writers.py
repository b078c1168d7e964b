"""The nodes and constants one placement writes: a QuantizeLinear -> DequantizeLinear pair, a
weight stored quantized behind a DequantizeLinear (or as a float behind Q -> DQ), an int32 bias
at the input scale x the weight scale."""

from __future__ import annotations

import numpy as np

from onnxq import ir
from onnxq.config.options import WeightOptions
from onnxq.materialize.weight_qparams import UINT8_MIDPOINT, signed
from onnxq.numerics.qparams import QParams, dequantize_weight, qtype_of_array, quantize_weight
from onnxq.place.annotations import TensorAnnotation


def insert_qdq(
    graph: ir.Graph,
    ann: TensorAnnotation,
    qp: QParams,
    weight_limit: int,
    options: WeightOptions,
    opset: int,
    values: np.ndarray | None = None,
) -> str:
    """Q/DQ (or DQ of a stored constant) for ``ann`` in ``graph``; returns the tensor its
    readers read instead (``weight_limit``: a weight's largest integer magnitude; ``opset``:
    the model's, which decides the domain of a 16-bit pair; ``values``: a weight's integers
    chosen before, else round-to-nearest)."""
    if ann.kind in ("activation", "shared"):
        return qdq_pair(graph, ann.tensor, qp, opset)
    if ann.kind == "weight":
        return write_weight(graph, ann.tensor, qp, weight_limit, options, opset, values)
    value = graph.const_value(ann.tensor)
    assert value is not None
    return dequantized_const(graph, ann.tensor, int32_bias(value, qp), qp)


def _consts(graph: ir.Graph, base: str, qp: QParams) -> tuple[str, str]:
    scale = graph.add_initializer(
        graph.unique_name(f"{base}_scale"), np.asarray(qp.scale, dtype=np.float32)
    )
    zero = graph.add_initializer(graph.unique_name(f"{base}_zero_point"), np.asarray(qp.zero_point))
    return scale, zero


def qdq_pair(graph: ir.Graph, tensor: str, qp: QParams, opset: int) -> str:
    """A QuantizeLinear -> DequantizeLinear pair on ``tensor``; returns the dequantized name
    (a 16-bit pair below opset 21 in onnxruntime's domain)."""
    scale, zero = _consts(graph, tensor, qp)
    attrs: dict[str, object] = {} if qp.axis is None else {"axis": qp.axis}
    domain = qtype_of_array(np.asarray(qp.zero_point)).domain_for(opset)
    if domain:
        attrs["domain"] = domain
    quantized = graph.unique_name(f"{tensor}_quantized")
    dequantized = graph.unique_name(f"{tensor}_dequantized")
    graph.add_node(
        "QuantizeLinear",
        [tensor, scale, zero],
        [quantized],
        graph.unique_name(f"{tensor}_QuantizeLinear"),
        **attrs,
    )
    graph.add_node(
        "DequantizeLinear",
        [quantized, scale, zero],
        [dequantized],
        graph.unique_name(f"{tensor}_DequantizeLinear"),
        **attrs,
    )
    return dequantized


def write_weight(
    graph: ir.Graph,
    tensor: str,
    qp: QParams,
    qmax: int,
    options: WeightOptions,
    opset: int,
    values: np.ndarray | None = None,
) -> str:
    """The weight behind DequantizeLinear (int8 storage, or uint8 where the zero point says so)
    or Q -> DQ (``qdq``); ``values``: integers chosen before, else round-to-nearest."""
    if options.weight_storage == "qdq":
        if values is not None:  # the float weight that Q maps back onto exactly these integers
            graph.set_initializer(tensor, dequantize_weight(values, signed(qp)))
        return qdq_pair(graph, tensor, qp, opset)
    if values is None:
        value = graph.const_value(tensor)
        assert value is not None
        values = quantize_weight(value, signed(qp), qmax)
    if np.asarray(qp.zero_point).dtype == np.uint8:  # the int8 values + 128
        values = (values.astype(np.int16) + UINT8_MIDPOINT).astype(np.uint8)
    return dequantized_const(graph, tensor, values, qp)


def dequantized_const(graph: ir.Graph, tensor: str, values: np.ndarray, qp: QParams) -> str:
    """The stored integer ``values`` of ``tensor`` behind a DequantizeLinear; returns the
    dequantized name."""
    stored = graph.add_initializer(graph.unique_name(f"{tensor}_quantized"), values)
    scale, zero = _consts(graph, tensor, qp)
    dequantized = graph.unique_name(f"{tensor}_dequantized")
    attrs = {} if qp.axis is None else {"axis": qp.axis}
    graph.add_node(
        "DequantizeLinear",
        [stored, scale, zero],
        [dequantized],
        graph.unique_name(f"{tensor}_DequantizeLinear"),
        **attrs,
    )
    return dequantized


def bias_qparams(
    graph: ir.Graph, ann: TensorAnnotation, acts: dict[str, QParams], weights: dict[str, QParams]
) -> tuple[QParams, np.ndarray] | None:
    """int32 bias with scale = input scale x weight scale, zero point 0."""
    x_name, w_name = ann.inputs
    if x_name not in acts or w_name not in weights:
        return None
    bias = graph.const_value(ann.tensor)
    if bias is None or bias.ndim != 1:
        return None
    w_scale = weights[w_name].scale.astype(np.float64)
    if w_scale.ndim == 1 and w_scale.size != bias.size:
        if bias.size % w_scale.size:
            return None  # no per-output-channel scale to derive: the bias stays float
        w_scale = np.tile(w_scale, bias.size // w_scale.size)  # grouped ConvTranspose
    scale = acts[x_name].scale.astype(np.float64) * w_scale
    scale = np.broadcast_to(scale, bias.shape).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1e-8)).astype(np.float32)
    if np.any(np.abs(np.rint(bias.astype(np.float64) / scale)) > 2**31 - 1):
        # 16-bit activations make the scale 256x finer: a large bias would saturate int32
        # (PP-OCRv5 det at int16: 8 biases clipped, output cosine 0.946); it stays float
        return None
    qp = QParams(scale, np.zeros(bias.shape, dtype=np.int32), 0, "derived")
    return qp, int32_bias(bias, qp)


def int32_bias(bias: np.ndarray, qp: QParams) -> np.ndarray:
    """A float bias at int32 with scale ``qp.scale``."""
    scaled = np.rint(bias.astype(np.float64) / qp.scale)
    return np.clip(scaled, -(2**31), 2**31 - 1).astype(np.int32)
