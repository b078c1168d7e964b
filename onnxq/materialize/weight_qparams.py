"""Weights' qparams as materialize writes them: in their precision's type, within the
integer limit of the weight (the profile's, its depthwise one, a ``bits`` override), and
stored as uint8 (the int8 values + 128) where the profile says so."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.options import WeightOptions
from onnxq.numerics.precisions import QType, tensor_qtype
from onnxq.numerics.qparams import QParams, weight_qparams
from onnxq.place.annotations import Annotations, TensorAnnotation

UINT8_MIDPOINT = 128  # the zero point of a symmetric weight stored as uint8


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


def stored_as(qp: QParams, dtype: str) -> QParams:
    """A symmetric weight's qparams for storage as ``dtype``: uint8 moves the zero point to 128
    (the values +128), which dequantizes to the same numbers."""
    if dtype != "uint8":
        return qp
    return replace(qp, zero_point=np.full(np.shape(qp.zero_point), UINT8_MIDPOINT, np.uint8))


def signed(qp: QParams) -> QParams:
    """``qp`` with a uint8-stored weight's zero point back at 0 (its int8 values' qparams)."""
    if np.asarray(qp.zero_point).dtype != np.uint8:
        return qp
    return replace(qp, zero_point=np.zeros(np.shape(qp.zero_point), np.int8))
