"""Q/DQ insertion: the only place that writes QuantizeLinear/DequantizeLinear nodes.

Input: the annotations (which tensors, read by which consumers) and qparams per activation.
Weights get their qparams here, from their own values (symmetric, per channel on the profile's
axis), and are stored quantized (int8, FP8) behind a DequantizeLinear (int8 weights as
uint8, the values + 128 behind zero point 128, where the profile's ``weight_dtype`` says so),
or as float initializers behind Q -> DQ (``weight_storage``).  Only the annotated consumers
are rewired to the dequantized tensor; other readers keep the float tensor.  Each pair's
element type is its tensor's precision's (``onnxq.numerics.precisions``); a 16-bit pair below opset
21 goes into onnxruntime's ``com.microsoft`` domain.  A dynamic profile's annotations become
onnxruntime's dynamic kernels instead (:mod:`onnxq.materialize.dynamic`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.options import WeightOptions
from onnxq.errors import InternalError
from onnxq.materialize.metadata import (
    METADATA_KEY,
    Placed,
    read_metadata,
    read_target_cpu,
    write_metadata,
)
from onnxq.materialize.shift import fold_shift, shift_input, shift_qparams
from onnxq.numerics.precisions import QType, tensor_qtype
from onnxq.numerics.qparams import (
    QParams,
    dequantize_weight,
    qtype_of_array,
    quantize_weight,
    weight_qparams,
)
from onnxq.place.annotations import Annotations, TensorAnnotation

QDQ_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear
UINT8_MIDPOINT = 128  # the zero point of a symmetric weight stored as uint8


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
    if profile.dynamic:
        from onnxq.materialize.dynamic import materialize_dynamic

        return materialize_dynamic(model, annotations, profile, weights_options)
    opset = max(ir.opset_version(model), QDQ_OPSET)  # where 16-bit pairs need a domain
    graph = ir.Graph(model)
    scopes = ir.scopes(graph)
    where = {n.name: (scope, n) for scope in scopes for n in scope.nodes}
    weights: dict[str, QParams] = {}
    placed: list[Placed] = []
    limits = weight_limits(graph, annotations, profile)
    chosen = dict(chosen_weights or {})
    for ann in annotations.of_kind("weight"):
        if ann.tensor in chosen:
            weight_qp = chosen[ann.tensor][0]
        else:
            value = _reader_scope(ann, where, graph).const_value(ann.tensor)
            if value is None:
                raise InternalError(f"weight {ann.tensor!r} lost its constant value")
            weight_qp = weight_qparams_of(ann, value, limits[ann.tensor], profile, weights_options)
        # uint8 storage is for onnxruntime's fused u8 x u8 kernels: int8 precision only
        weights[ann.tensor] = (
            _stored_as(weight_qp, profile.weight_dtype)
            if ann.settings.precision == "int8"
            else weight_qp
        )
    resolved = dict(activation_qparams)
    shifts = _fold_shifts(annotations, resolved, where, weights, limits, chosen)
    for ann in annotations.tensors.values():
        qp = _qparams(ann, resolved, weights, _reader_scope(ann, where, graph))
        if qp is None:
            continue  # no statistics (the report says so), or a bias that stays float
        qtype = qtype_of_array(np.asarray(qp.zero_point))
        for scope, readers in _readers_by_scope(ann, where):
            if ann.tensor in shifts:
                qp, shift = shifts[ann.tensor]
                out = _qdq(scope, shift_input(scope, ann.tensor, shift, readers), qp, opset)
            else:
                values = chosen[ann.tensor][1] if ann.tensor in chosen else None
                limit = limits.get(ann.tensor, 0)
                out = _insert(scope, ann, qp, limit, weights_options, opset, values)
            for node, index in readers:
                scope.set_input(node, index, out)
        bits = _bits(ann, qtype, limits.get(ann.tensor, 0))
        placed.append(Placed(ann.tensor, ann.kind, qp, tuple(ann.consumers), bits, qtype.name))
        if qtype.domain_for(opset):
            ir.set_domain_opset(model, qtype.domain_for(opset), 1)
    if placed:
        ir.set_opset(model, QDQ_OPSET)
    for scope in reversed(scopes):  # bodies inside out, the top-level graph last
        scope.commit()
    write_metadata(model, placed, profile.target_cpu)
    return placed


def _fold_shifts(
    annotations: Annotations,
    resolved: dict[str, QParams],
    where: dict[str, tuple[ir.Graph, onnx.NodeProto]],
    weights: dict[str, QParams],
    limits: dict[str, int],
    chosen: Mapping[str, tuple[QParams, np.ndarray]],
) -> dict[str, tuple[QParams, float]]:
    """For each activation placement marked ``shift`` that has symmetric integer qparams:
    its shifted qparams and shift, added back through its readers' biases here, before any
    reader reads a DequantizeLinear (:mod:`onnxq.materialize.shift`)."""

    def weight_of(node: onnx.NodeProto) -> np.ndarray:
        scope, name = where[node.name][0], node.input[1]
        value = scope.const_value(name)
        if value is None:
            raise InternalError(f"weight {name!r} of {node.name!r} lost its constant value")
        if name not in weights:
            return value  # a float weight
        qp = _signed(weights[name])
        values = chosen[name][1] if name in chosen else quantize_weight(value, qp, limits[name])
        return dequantize_weight(values, qp)

    shifts: dict[str, tuple[QParams, float]] = {}
    for ann in annotations.of_kind("activation"):
        qp = resolved.get(ann.tensor)
        if not ann.shift or qp is None or qp.zero_point.dtype.kind != "i":
            continue
        if np.any(np.asarray(qp.zero_point) != 0):
            continue
        shifts[ann.tensor] = shift_qparams(qp, _bits(ann, qtype_of_array(qp.zero_point), 0))
        readers = [where[name][1] for name, _ in ann.consumers]
        fold_shift(where[readers[0].name][0], readers, shifts[ann.tensor][1], weight_of)
    return shifts


def weight_qparams_of(
    ann: TensorAnnotation,
    value: np.ndarray,
    limit: int,
    profile: BackendProfile,
    options: WeightOptions,
) -> QParams:
    """A weight's qparams in its precision's type (int8 weights with zero point 0, whatever
    their storage), its integers within ``+-limit``: what materialize writes and what bias
    correction measures."""
    return weight_qparams(value, ann.axis, limit, options.weight_method, _qtype(ann, profile).name)


def _qtype(ann: TensorAnnotation, profile: BackendProfile) -> QType:
    """The element type of an annotated tensor: its precision's, for its kind and backend."""
    return tensor_qtype(ann.kind, ann.settings.precision, profile.activation_dtype)


def _bits(ann: TensorAnnotation, qtype: QType, weight_limit: int) -> int:
    """The bits a placed tensor uses: an integer weight's come from its limit (+-63: 7,
    whatever its storage type), an activation's from a ``bits`` override, else its type's."""
    if ann.kind == "bias":
        return qtype.bits
    if ann.kind == "weight" and not qtype.is_float:
        return weight_limit.bit_length() + 1
    return ann.settings.bits or qtype.bits


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
    opset: int,
    values: np.ndarray | None = None,
) -> str:
    """Q/DQ (or DQ of a stored constant) for ``ann`` in ``graph``; returns the tensor its
    readers read instead (``weight_limit``: a weight's largest integer magnitude; ``opset``:
    the model's, which decides the domain of a 16-bit pair; ``values``: a weight's integers
    chosen before, else round-to-nearest)."""
    if ann.kind in ("activation", "shared"):
        return _qdq(graph, ann.tensor, qp, opset)
    if ann.kind == "weight":
        return _weight(graph, ann.tensor, qp, weight_limit, options, opset, values)
    value = graph.const_value(ann.tensor)
    assert value is not None
    return _dequantize_const(graph, ann.tensor, _int32_bias(value, qp), qp)


def _consts(graph: ir.Graph, base: str, qp: QParams) -> tuple[str, str]:
    scale = graph.add_initializer(
        graph.unique_name(f"{base}_scale"), np.asarray(qp.scale, dtype=np.float32)
    )
    zero = graph.add_initializer(graph.unique_name(f"{base}_zero_point"), np.asarray(qp.zero_point))
    return scale, zero


def _qdq(graph: ir.Graph, tensor: str, qp: QParams, opset: int) -> str:
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


def weight_limits(
    graph: ir.Graph, annotations: Annotations, profile: BackendProfile
) -> dict[str, int]:
    """Each annotated weight's largest integer magnitude: the profile's limit (its depthwise
    one for a weight that only depthwise convs read), narrowed by a ``bits`` override (an FP8
    weight takes FP8's own range: ``onnxq.numerics.qparams.weight_qparams``)."""
    scopes = ir.scopes(graph) if profile.depthwise_weight_qmax else []
    readers = {n.name: (scope, n) for scope in scopes for n in scope.nodes}
    limits = {}
    for ann in annotations.of_kind("weight"):
        limit = profile.weight_qmax
        if profile.depthwise_weight_qmax and _read_by_depthwise_convs(ann, readers):
            limit = profile.depthwise_weight_qmax
        bits = ann.settings.bits
        limits[ann.tensor] = limit if bits is None else min(limit, 2 ** (bits - 1) - 1)
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


def _stored_as(qp: QParams, dtype: str) -> QParams:
    """A symmetric weight's qparams for storage as ``dtype``: uint8 moves the zero point to 128
    (the values +128), which dequantizes to the same numbers."""
    if dtype != "uint8":
        return qp
    return replace(qp, zero_point=np.full(np.shape(qp.zero_point), UINT8_MIDPOINT, np.uint8))


def _weight(
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
            graph.set_initializer(tensor, dequantize_weight(values, _signed(qp)))
        return _qdq(graph, tensor, qp, opset)
    if values is None:
        value = graph.const_value(tensor)
        assert value is not None
        values = quantize_weight(value, _signed(qp), qmax)
    if np.asarray(qp.zero_point).dtype == np.uint8:  # the int8 values + 128
        values = (values.astype(np.int16) + UINT8_MIDPOINT).astype(np.uint8)
    return _dequantize_const(graph, tensor, values, qp)


def _signed(qp: QParams) -> QParams:
    """``qp`` with a uint8-stored weight's zero point back at 0 (its int8 values' qparams)."""
    if np.asarray(qp.zero_point).dtype != np.uint8:
        return qp
    return replace(qp, zero_point=np.zeros(np.shape(qp.zero_point), np.int8))


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
    if np.any(np.abs(np.rint(bias.astype(np.float64) / scale)) > 2**31 - 1):
        # 16-bit activations make the scale 256x finer: a large bias would saturate int32
        # (PP-OCRv5 det at int16: 8 biases clipped, output cosine 0.946); it stays float
        return None
    qp = QParams(scale, np.zeros(bias.shape, dtype=np.int32), 0, "derived")
    return qp, _int32_bias(bias, qp)


def _int32_bias(bias: np.ndarray, qp: QParams) -> np.ndarray:
    """A float bias at int32 with scale ``qp.scale``."""
    scaled = np.rint(bias.astype(np.float64) / qp.scale)
    return np.clip(scaled, -(2**31), 2**31 - 1).astype(np.int32)


# Placed and the metadata functions live in onnxq.materialize.metadata; importing them from here
# still works
__all__ = [
    "METADATA_KEY",
    "QDQ_OPSET",
    "Placed",
    "materialize",
    "read_metadata",
    "read_target_cpu",
    "weight_limits",
    "write_metadata",
]
