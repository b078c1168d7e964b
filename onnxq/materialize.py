"""Q/DQ insertion: the only place that writes QuantizeLinear/DequantizeLinear nodes.

Input: the annotations (which tensors, read by which consumers) and qparams per activation.
Weights get their qparams here, from their own values (symmetric, per channel on the profile's
axis), and are stored as int8 initializers behind a DequantizeLinear, or as float initializers
behind Q -> DQ (``weight_storage``).  Only the annotated consumers are rewired to the
dequantized tensor; other readers keep the float tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.annotate import Annotations, TensorAnnotation
from onnxq.backends.profile import BackendProfile
from onnxq.config import QuantConfig
from onnxq.errors import InternalError
from onnxq.observers import QParams, dequantize_weight, quantize_weight, weight_qparams

QDQ_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear


@dataclass(frozen=True)
class Placed:
    """One tensor that received Q/DQ: its kind and qparams."""

    tensor: str
    kind: str
    qparams: QParams
    consumers: tuple[tuple[str, int], ...]
    bits: int = 8


def materialize(
    model: onnx.ModelProto,
    annotations: Annotations,
    activation_qparams: dict[str, QParams],
    profile: BackendProfile,
    config: QuantConfig,
    chosen_weights: Mapping[str, tuple[QParams, np.ndarray]] | None = None,
) -> list[Placed]:
    """Insert Q/DQ into ``model`` (edited in place); returns what was placed, in order.

    ``chosen_weights``: weight tensor -> (qparams, int8 values) decided before (AdaRound);
    other weights are rounded to nearest here."""
    graph = ir.Graph(model)
    by_name = {n.name: n for n in graph.nodes}
    chosen = dict(chosen_weights or {})
    weights: dict[str, QParams] = {}
    placed: list[Placed] = []
    for ann in annotations.tensors.values():
        if ann.kind == "weight" and ann.tensor in chosen:
            weights[ann.tensor] = chosen[ann.tensor][0]
        elif ann.kind == "weight":
            value = graph.const_value(ann.tensor)
            if value is None:
                raise InternalError(f"weight {ann.tensor!r} lost its constant value")
            weights[ann.tensor] = weight_qparams(
                value, ann.axis, weight_qmax(ann, profile), config.weight_method
            )
    resolved = dict(activation_qparams)
    for ann in annotations.tensors.values():
        if ann.kind in ("activation", "shared"):
            source = ann.inputs[0] if ann.kind == "shared" else ann.tensor
            qp = resolved.get(source)
            if qp is None:
                continue  # no statistics (the report says so)
            if ann.kind == "shared":
                qp = replace(qp, method=f"shared with {source}")
                resolved[ann.tensor] = qp
            out = _qdq(graph, ann.tensor, qp)
        elif ann.kind == "weight":
            qp = weights[ann.tensor]
            values = chosen[ann.tensor][1] if ann.tensor in chosen else None
            out = _weight(graph, ann.tensor, qp, weight_qmax(ann, profile), config, values)
        else:
            bias = _bias_qparams(graph, ann, resolved, weights)
            if bias is None:
                continue
            qp, values = bias
            out = _dequantize_const(graph, ann.tensor, values, qp)
        for node_name, index in ann.consumers:
            graph.set_input(by_name[node_name], index, out)
        bits = 32 if ann.kind == "bias" else ann.settings.bits
        placed.append(Placed(ann.tensor, ann.kind, qp, tuple(ann.consumers), bits))
    if placed:
        ir.set_opset(model, QDQ_OPSET)
    graph.commit()
    write_metadata(model, placed)
    return placed


METADATA_KEY = "onnxq.quantization"


def write_metadata(model: onnx.ModelProto, placed: list[Placed]) -> None:
    """Record each quantized tensor's bit width, method and scheme in ``metadata_props``.

    The value under :data:`METADATA_KEY` is JSON: ``{"version": ..., "tensors": {name: {"kind",
    "bits", "method", "axis", "symmetric"}}}`` (Sparsebit's "extra bit info", as model
    metadata so that every ONNX tool keeps it).
    """
    import json

    from onnxq import __version__

    tensors = {
        p.tensor: {
            "kind": p.kind,
            "bits": p.bits,
            "method": p.qparams.method,
            "axis": p.qparams.axis,
            "symmetric": bool(np.all(np.asarray(p.qparams.zero_point) == 0)),
        }
        for p in placed
    }
    value = json.dumps({"version": __version__, "tensors": tensors}, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=METADATA_KEY, value=value)


def read_metadata(model: onnx.ModelProto) -> dict[str, dict[str, object]] | None:
    """The per-tensor records written by :func:`write_metadata` (``None`` if absent)."""
    import json

    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                return dict(json.loads(prop.value).get("tensors", {}))
            except (ValueError, AttributeError):
                return None
    return None


def _consts(graph: ir.Graph, base: str, qp: QParams) -> tuple[str, str]:
    scale = graph.add_initializer(
        graph.unique_name(f"{base}_scale"), np.asarray(qp.scale, dtype=np.float32)
    )
    zero = graph.add_initializer(graph.unique_name(f"{base}_zero_point"), np.asarray(qp.zero_point))
    return scale, zero


def _qdq(graph: ir.Graph, tensor: str, qp: QParams) -> str:
    scale, zero = _consts(graph, tensor, qp)
    attrs = {} if qp.axis is None else {"axis": qp.axis}
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


def weight_qmax(ann: TensorAnnotation, profile: BackendProfile) -> int:
    """Largest weight magnitude: the profile's limit, narrowed by a ``bits`` override."""
    return min(profile.weight_qmax, 2 ** (ann.settings.bits - 1) - 1)


def _weight(
    graph: ir.Graph,
    tensor: str,
    qp: QParams,
    qmax: int,
    config: QuantConfig,
    values: np.ndarray | None = None,
) -> str:
    """The weight behind DequantizeLinear (int8 storage) or Q -> DQ (``qdq``); ``values``:
    integers chosen before, else round-to-nearest."""
    if config.weight_storage == "qdq":
        if values is not None:  # the float weight Q maps back onto exactly these integers
            graph.set_initializer(tensor, dequantize_weight(values, qp))
        return _qdq(graph, tensor, qp)
    if values is None:
        value = graph.const_value(tensor)
        assert value is not None
        values = quantize_weight(value, qp, qmax)
    return _dequantize_const(graph, tensor, values, qp)


def _dequantize_const(graph: ir.Graph, tensor: str, values: np.ndarray, qp: QParams) -> str:
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


def _bias_qparams(
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
    q = np.clip(np.rint(bias.astype(np.float64) / scale), -(2**31), 2**31 - 1).astype(np.int32)
    qp = QParams(scale, np.zeros(bias.shape, dtype=np.int32), 0, "derived")
    return qp, q
