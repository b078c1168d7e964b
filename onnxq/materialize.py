"""Q/DQ insertion: the only place that writes QuantizeLinear/DequantizeLinear nodes.

Input: the annotations (which tensors, read by which consumers) and qparams per activation.
Weights get their qparams here, from their own values (symmetric, per channel on the profile's
axis), and are stored as int8 initializers behind a DequantizeLinear, or as float initializers
behind Q -> DQ (``weight_storage``).  Only the annotated consumers are rewired to the
dequantized tensor; other readers keep the float tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.errors import InternalError
from onnxq.observers import QParams, quantize_weight, weight_qparams
from onnxq.options import WeightOptions
from onnxq.place.annotations import Annotations, TensorAnnotation

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
    weights_options: WeightOptions,
) -> list[Placed]:
    """Insert Q/DQ into ``model`` (edited in place); returns what was placed, in order."""
    graph = ir.Graph(model)
    by_name = {n.name: n for n in graph.nodes}
    weights: dict[str, QParams] = {}
    placed: list[Placed] = []
    limits = weight_limits(graph, annotations, profile)
    for ann in annotations.of_kind("weight"):
        value = graph.const_value(ann.tensor)
        if value is None:
            raise InternalError(f"weight {ann.tensor!r} lost its constant value")
        weights[ann.tensor] = weight_qparams(
            value, ann.axis, limits[ann.tensor], weights_options.weight_method
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
            out = _weight(graph, ann.tensor, qp, limits[ann.tensor], weights_options)
        else:
            bias = _bias_qparams(graph, ann, resolved, weights)
            if bias is None:
                continue
            qp, values = bias
            out = _dequantize_const(graph, ann.tensor, values, qp)
        for node_name, index in ann.consumers:
            graph.set_input(by_name[node_name], index, out)
        # a weight limited to +-63 has 7 bits, whatever its storage type
        bits = {"bias": 32, "weight": limits.get(ann.tensor, 0).bit_length() + 1}.get(
            ann.kind, ann.settings.bits
        )
        placed.append(Placed(ann.tensor, ann.kind, qp, tuple(ann.consumers), bits))
    if placed:
        ir.set_opset(model, QDQ_OPSET)
    graph.commit()
    write_metadata(model, placed, profile.target_cpu)
    return placed


METADATA_KEY = "onnxq.quantization"


def write_metadata(
    model: onnx.ModelProto, placed: list[Placed], target_cpu: str | None = None
) -> None:
    """Record each quantized tensor's bit width, method and scheme in ``metadata_props``.

    The value under :data:`METADATA_KEY` is JSON: ``{"version": ..., "tensors": {name: {"kind",
    "bits", "method", "axis", "symmetric"}}}`` (Sparsebit's "extra bit info", as model
    metadata so that every ONNX tool keeps it), with ``"target_cpu"``, the CPU class the
    output was tuned for, when the backend's output depends on it.
    """
    import json

    from onnxq.version import __version__

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
    record: dict[str, object] = {"version": __version__, "tensors": tensors}
    if target_cpu is not None:
        record["target_cpu"] = target_cpu
    value = json.dumps(record, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=METADATA_KEY, value=value)


def read_target_cpu(model: onnx.ModelProto) -> str | None:
    """The CPU class recorded by :func:`write_metadata` (``None`` if none was)."""
    import json

    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                value = json.loads(prop.value).get("target_cpu")
            except (ValueError, AttributeError):
                return None
            return value if isinstance(value, str) else None
    return None


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


def weight_limits(
    graph: ir.Graph, annotations: Annotations, profile: BackendProfile
) -> dict[str, int]:
    """Each annotated weight's largest integer magnitude: the profile's limit (its depthwise
    one for a weight that only depthwise convs read), narrowed by a ``bits`` override."""
    readers = {n.name: n for n in graph.nodes} if profile.depthwise_weight_qmax else {}
    limits = {}
    for ann in annotations.of_kind("weight"):
        limit = profile.weight_qmax
        if profile.depthwise_weight_qmax and _read_by_depthwise_convs(ann, graph, readers):
            limit = profile.depthwise_weight_qmax
        limits[ann.tensor] = min(limit, 2 ** (ann.settings.bits - 1) - 1)
    return limits


def _read_by_depthwise_convs(
    ann: TensorAnnotation, graph: ir.Graph, readers: dict[str, onnx.NodeProto]
) -> bool:
    """True if every consumer of the weight is a Conv with one input and one output channel
    per group (the kernel onnxruntime runs apart from its matrix multiplication)."""
    info = graph.const_info(ann.tensor)
    if info is None or len(info.shape) < 3 or info.shape[1] != 1 or not ann.consumers:
        return False
    for name, _ in ann.consumers:
        node = readers.get(name)
        if node is None or node.op_type != "Conv":
            return False
        if int(ir.node_attrs(node).get("group", 1)) != info.shape[0]:
            return False
    return True


def _weight(graph: ir.Graph, tensor: str, qp: QParams, qmax: int, options: WeightOptions) -> str:
    if options.weight_storage == "qdq":
        return _qdq(graph, tensor, qp)
    value = graph.const_value(tensor)
    assert value is not None
    return _dequantize_const(graph, tensor, quantize_weight(value, qp, qmax), qp)


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
