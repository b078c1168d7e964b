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
from onnxq.backends.profile import BackendProfile
from onnxq.errors import InternalError
from onnxq.observers import QParams, dequantize_weight, quantize_weight, weight_qparams
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
    chosen_weights: Mapping[str, tuple[QParams, np.ndarray]] | None = None,
) -> list[Placed]:
    """Insert Q/DQ into ``model`` (edited in place); returns what was placed, in order.

    ``chosen_weights``: weight tensor -> (qparams, integer values) decided before (AdaRound);
    other weights are rounded to nearest here.

    Q/DQ nodes (and the constants they read) go into the graph of the consumers they serve: a
    control-flow body's for an op inside it, one set per graph when a tensor is read in
    several (a Conv inside an If branch quantizes the activation it reads from the enclosing
    graph there)."""
    graph = ir.Graph(model)
    scopes = ir.scopes(graph)
    where = {n.name: (scope, n) for scope in scopes for n in scope.nodes}
    weights: dict[str, QParams] = {}
    placed: list[Placed] = []
    limits = weight_limits(graph, annotations, profile)
    chosen = dict(chosen_weights or {})
    for ann in annotations.of_kind("weight"):
        if ann.tensor in chosen:
            weights[ann.tensor] = chosen[ann.tensor][0]
            continue
        value = _reader_scope(ann, where, graph).const_value(ann.tensor)
        if value is None:
            raise InternalError(f"weight {ann.tensor!r} lost its constant value")
        weights[ann.tensor] = weight_qparams(
            value, ann.axis, limits[ann.tensor], weights_options.weight_method
        )
    resolved = dict(activation_qparams)
    for ann in annotations.tensors.values():
        qp = _qparams(ann, resolved, weights, _reader_scope(ann, where, graph))
        if qp is None:
            continue  # no statistics (the report says so), or a bias that stays float
        for scope, readers in _readers_by_scope(ann, where):
            values = chosen[ann.tensor][1] if ann.tensor in chosen else None
            out = _insert(scope, ann, qp, limits.get(ann.tensor, 0), weights_options, values)
            for node, index in readers:
                scope.set_input(node, index, out)
        # a weight limited to +-63 has 7 bits, whatever its storage type
        bits = {"bias": 32, "weight": limits.get(ann.tensor, 0).bit_length() + 1}.get(
            ann.kind, ann.settings.bits
        )
        placed.append(Placed(ann.tensor, ann.kind, qp, tuple(ann.consumers), bits))
    if placed:
        ir.set_opset(model, QDQ_OPSET)
    for scope in reversed(scopes):  # bodies inside out, the top-level graph last
        scope.commit()
    write_metadata(model, placed, profile.target_cpu)
    return placed


def _reader_scope(
    ann: TensorAnnotation, where: dict[str, tuple[ir.Graph, onnx.NodeProto]], top: ir.Graph
) -> ir.Graph:
    """The graph of ``ann``'s first reader: it sees the tensor (its own or an outer scope's)."""
    return where[ann.consumers[0][0]][0] if ann.consumers else top


def _readers_by_scope(
    ann: TensorAnnotation, where: dict[str, tuple[ir.Graph, onnx.NodeProto]]
) -> list[tuple[ir.Graph, list[tuple[onnx.NodeProto, int]]]]:
    """``ann``'s readers grouped by the graph they sit in, in the order first read."""
    groups: dict[int, tuple[ir.Graph, list[tuple[onnx.NodeProto, int]]]] = {}
    for name, index in ann.consumers:
        scope, node = where[name]
        groups.setdefault(id(scope), (scope, []))[1].append((node, index))
    return list(groups.values())


def _qparams(
    ann: TensorAnnotation,
    resolved: dict[str, QParams],
    weights: dict[str, QParams],
    scope: ir.Graph,
) -> QParams | None:
    """The qparams of one annotated tensor (None: it stays float)."""
    if ann.kind in ("activation", "shared"):
        source = ann.inputs[0] if ann.kind == "shared" else ann.tensor
        qp = resolved.get(source)
        if qp is not None and ann.kind == "shared":
            qp = replace(qp, method=f"shared with {source}")
            resolved[ann.tensor] = qp
        return qp
    if ann.kind == "weight":
        return weights[ann.tensor]
    bias = _bias_qparams(scope, ann, resolved, weights)
    return None if bias is None else bias[0]


def _insert(
    graph: ir.Graph,
    ann: TensorAnnotation,
    qp: QParams,
    weight_limit: int,
    options: WeightOptions,
    values: np.ndarray | None = None,
) -> str:
    """Q/DQ (or DQ of a stored constant) for ``ann`` in ``graph``; returns the tensor its
    readers read instead (``weight_limit``: a weight's largest integer magnitude; ``values``:
    a weight's integers chosen before, else round-to-nearest)."""
    if ann.kind in ("activation", "shared"):
        return _qdq(graph, ann.tensor, qp)
    if ann.kind == "weight":
        return _weight(graph, ann.tensor, qp, weight_limit, options, values)
    value = graph.const_value(ann.tensor)
    assert value is not None
    return _dequantize_const(graph, ann.tensor, _int32_bias(value, qp), qp)


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
    scopes = ir.scopes(graph) if profile.depthwise_weight_qmax else []
    readers = {n.name: (scope, n) for scope in scopes for n in scope.nodes}
    limits = {}
    for ann in annotations.of_kind("weight"):
        limit = profile.weight_qmax
        if profile.depthwise_weight_qmax and _read_by_depthwise_convs(ann, readers):
            limit = profile.depthwise_weight_qmax
        limits[ann.tensor] = min(limit, 2 ** (ann.settings.bits - 1) - 1)
    return limits


def _read_by_depthwise_convs(
    ann: TensorAnnotation, readers: dict[str, tuple[ir.Graph, onnx.NodeProto]]
) -> bool:
    """True if every consumer of the weight is a Conv with one input and one output channel
    per group (the kernel onnxruntime runs apart from its matrix multiplication); ``readers``:
    node name -> (its graph, the node), over every scope."""
    if not ann.consumers or ann.consumers[0][0] not in readers:
        return False
    info = readers[ann.consumers[0][0]][0].const_info(ann.tensor)
    if info is None or len(info.shape) < 3 or info.shape[1] != 1:
        return False
    for name, _ in ann.consumers:
        node = readers[name][1] if name in readers else None
        if node is None or node.op_type != "Conv":
            return False
        if int(ir.node_attrs(node).get("group", 1)) != info.shape[0]:
            return False
    return True


def _weight(
    graph: ir.Graph,
    tensor: str,
    qp: QParams,
    qmax: int,
    options: WeightOptions,
    values: np.ndarray | None = None,
) -> str:
    """The weight behind DequantizeLinear (int8 storage) or Q -> DQ (``qdq``); ``values``:
    integers chosen before, else round-to-nearest."""
    if options.weight_storage == "qdq":
        if values is not None:  # the float weight that Q maps back onto exactly these integers
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
    qp = QParams(scale, np.zeros(bias.shape, dtype=np.int32), 0, "derived")
    return qp, _int32_bias(bias, qp)


def _int32_bias(bias: np.ndarray, qp: QParams) -> np.ndarray:
    """A float bias at int32 with scale ``qp.scale``."""
    scaled = np.rint(bias.astype(np.float64) / qp.scale)
    return np.clip(scaled, -(2**31), 2**31 - 1).astype(np.int32)
