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
from onnxq.materialize.weight_qparams import signed, stored_as, weight_limits, weight_qparams_of
from onnxq.materialize.writers import bias_qparams, insert_qdq, qdq_pair
from onnxq.numerics.precisions import QType
from onnxq.numerics.qparams import QParams, dequantize_weight, qtype_of_array, quantize_weight
from onnxq.place.annotations import Annotations, TensorAnnotation

QDQ_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear


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
    limits = weight_limits(graph, annotations, profile)
    chosen = dict(chosen_weights or {})
    weights = _weight_qparams(annotations, where, graph, limits, chosen, profile, weights_options)
    resolved = dict(activation_qparams)
    shifts = _fold_shifts(annotations, resolved, where, weights, limits, chosen)
    placed: list[Placed] = []
    for ann in annotations.tensors.values():
        qp = _qparams(ann, resolved, weights, _reader_scope(ann, where, graph))
        if qp is None:
            continue  # no statistics (the report says so), or a bias that stays float
        qtype = qtype_of_array(np.asarray(qp.zero_point))
        for scope, readers in _readers_by_scope(ann, where):
            if ann.tensor in shifts:
                qp, shift = shifts[ann.tensor]
                out = qdq_pair(scope, shift_input(scope, ann.tensor, shift, readers), qp, opset)
            else:
                values = chosen[ann.tensor][1] if ann.tensor in chosen else None
                limit = limits.get(ann.tensor, 0)
                out = insert_qdq(scope, ann, qp, limit, weights_options, opset, values)
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


def _weight_qparams(
    annotations: Annotations,
    where: dict[str, tuple[ir.Graph, onnx.NodeProto]],
    graph: ir.Graph,
    limits: dict[str, int],
    chosen: Mapping[str, tuple[QParams, np.ndarray]],
    profile: BackendProfile,
    options: WeightOptions,
) -> dict[str, QParams]:
    """Each annotated weight's qparams as stored: chosen before (AdaRound), else from its own
    values; an int8 weight as uint8 where the profile's ``weight_dtype`` says so."""
    weights: dict[str, QParams] = {}
    for ann in annotations.of_kind("weight"):
        if ann.tensor in chosen:
            weight_qp = chosen[ann.tensor][0]
        else:
            value = _reader_scope(ann, where, graph).const_value(ann.tensor)
            if value is None:
                raise InternalError(f"weight {ann.tensor!r} lost its constant value")
            weight_qp = weight_qparams_of(ann, value, limits[ann.tensor], profile, options)
        # uint8 storage is for onnxruntime's fused u8 x u8 kernels: int8 precision only
        weights[ann.tensor] = (
            stored_as(weight_qp, profile.weight_dtype)
            if ann.settings.precision == "int8"
            else weight_qp
        )
    return weights


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
        qp = signed(weights[name])
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
    bias = bias_qparams(scope, ann, resolved, weights)
    return None if bias is None else bias[0]


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
