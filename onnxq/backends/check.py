"""The static constraint checker: ``check(model, profile)`` lists every violation.

It reads only the graph, so it runs everywhere (no GPU, no TensorRT).  What it enforces comes
from the profile: symmetric zero points, allowed Q/DQ element types, per-axis scales only on
constants, the weight axis of each op, the minimum opset for ``axis``, forbidden op types;
for a strongly typed backend, the typing rules of :mod:`onnxq.backends.typing_rules`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.backends.check_blocked import check_blocked_dq, check_weight_only_op, is_blocked
from onnxq.backends.check_precision import DYNAMIC_KERNELS, check_dynamic, check_qtype
from onnxq.backends.profile import BackendProfile
from onnxq.backends.typing_rules import check_typing
from onnxq.errors import Violation
from onnxq.numerics.precisions import CONTRIB_DOMAIN


def check(model: onnx.ModelProto, profile: BackendProfile) -> list[Violation]:
    """Every way ``model`` breaks ``profile``'s constraints (empty list: it conforms)."""
    out: list[Violation] = []
    opset = ir.opset_version(model)
    scopes: dict[int, Scope] = {}
    for graph, where, parent in _graphs(model.graph, "", None):
        outer = scopes.get(id(parent)) if parent is not None else None
        index = Scope(ir.Graph(_as_model(model, graph)), outer)
        scopes[id(graph)] = index
        for node in graph.node:
            name = f"{where}{node.name or node.op_type}"
            if node.op_type in profile.forbidden_ops:
                out.append(
                    Violation(name, "op_type", f"Q/DQ format (no {node.op_type})", node.op_type)
                )
            if is_blocked(node) and node.domain in ir.DEFAULT_DOMAINS:
                out.extend(check_blocked_dq(node, name, index, profile, opset))
            elif node.op_type in ir.QDQ_OPS and node.domain in QDQ_DOMAINS:
                out.extend(_check_qdq(node, name, index, profile, opset))
                out.extend(check_qtype(node, name, index, opset))
            elif node.op_type in ir.WEIGHT_ONLY_OPS and node.op_type not in profile.forbidden_ops:
                out.extend(check_weight_only_op(node, name, index, profile))
            if node.domain == CONTRIB_DOMAIN and node.op_type in DYNAMIC_KERNELS:
                out.extend(check_dynamic(node, name, index))
    if profile.strong_typing:
        out.extend(check_typing(model))
    return out


# onnxruntime runs 16-bit Q/DQ below opset 21 in its contrib domain
QDQ_DOMAINS = (*ir.DEFAULT_DOMAINS, CONTRIB_DOMAIN)


class Scope:
    """A graph's index that falls back to the enclosing graphs for outer-scope names."""

    def __init__(self, graph: ir.Graph, outer: Scope | None):
        self.graph = graph
        self.outer = outer
        self.producer = graph.producer
        self.consumers = graph.consumers

    def _local(self, name: str) -> bool:
        g = self.graph
        return (
            name in g.initializers
            or name in g.producer
            or name in g.graph_inputs
            or name in g.constant_nodes
        )

    def _owner(self, name: str) -> ir.Graph:
        scope: Scope | None = self
        while scope is not None:
            if scope._local(name):
                return scope.graph
            scope = scope.outer
        return self.graph

    def const_value(self, name: str) -> Any:
        return self._owner(name).const_value(name)

    def is_const(self, name: str) -> bool:
        return self._owner(name).is_const(name)

    def elem_type(self, name: str) -> int | None:
        return self._owner(name).elem_type(name)

    def shape(self, name: str) -> Any:
        return self._owner(name).shape(name)


def _graphs(
    graph: onnx.GraphProto,
    prefix: str,
    parent: onnx.GraphProto | None,
) -> Iterator[tuple[onnx.GraphProto, str, onnx.GraphProto | None]]:
    yield graph, prefix, parent
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield from _graphs(sub, f"{prefix}{node.name}/{attr.name}/", graph)


def _as_model(model: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    if graph is model.graph:
        return model
    wrapper = onnx.ModelProto()
    wrapper.graph.CopyFrom(graph)
    wrapper.opset_import.extend(model.opset_import)
    return wrapper


def _check_qdq(
    node: onnx.NodeProto, name: str, g: Scope, profile: BackendProfile, opset: int
) -> list[Violation]:
    v: list[Violation] = []
    attrs = ir.node_attrs(node)
    scale_name = node.input[1] if len(node.input) > 1 else ""
    zp_name = node.input[2] if len(node.input) > 2 else ""
    scale = g.const_value(scale_name) if scale_name else None
    if scale is None:
        v.append(Violation(name, "scale", "a constant initializer", f"non-constant {scale_name!r}"))
    else:
        if scale.ndim > 1:
            v.append(Violation(name, "scale shape", "scalar or 1-D", str(list(scale.shape))))
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            bad = scale[~(np.isfinite(scale) & (scale > 0))].ravel()[:3].tolist()
            v.append(Violation(name, "scale", "> 0 and finite", f"{bad}"))
    if "axis" in attrs and opset < 13:
        v.append(Violation(name, "axis", "opset >= 13 for the axis attribute", f"opset {opset}"))
    v.extend(_check_zero_point(node, name, g, profile, zp_name))
    if scale is not None and scale.ndim == 1 and scale.size > 1:
        v.extend(_check_per_axis(node, name, g, profile, int(attrs.get("axis", 1)), scale.size))
    if (
        scale is not None
        and node.op_type == "DequantizeLinear"
        and g.elem_type(node.input[0]) == TensorProto.INT32
    ):
        v.extend(_check_bias_scale(node, name, g, scale))
    return v


def _check_bias_scale(
    node: onnx.NodeProto, name: str, g: Scope, scale: np.ndarray
) -> list[Violation]:
    """An int32 bias must be stored at its layer's scale, input scale x weight scale: the
    integer kernel adds it to the int32 sums as it is (a bias shared by two layers of other
    scales is right for one of them only).  An all-zero bias is zero at any scale."""
    values = g.const_value(node.input[0])
    if values is None or not np.any(values):
        return []
    out = []
    for consumer, index in g.consumers.get(node.output[0], []):
        if consumer.op_type not in ir.BIAS_READERS or index != 2 or len(consumer.input) < 2:
            continue
        parts = []
        for tensor in consumer.input[:2]:
            dq = g.producer.get(tensor)
            part = (
                g.const_value(dq.input[1])
                if dq is not None and dq.op_type == "DequantizeLinear" and len(dq.input) > 1
                else None
            )
            if part is None:
                break
            parts.append(np.asarray(part, dtype=np.float64))
        if len(parts) != 2:
            continue
        try:
            want = (
                np.broadcast_to(parts[0] * parts[1], np.shape(scale))
                if scale.ndim
                else parts[0] * parts[1]
            )
        except ValueError:
            continue
        if np.shape(want) != np.shape(scale) and np.size(want) != 1:
            continue
        have = np.asarray(scale, dtype=np.float64)
        if not np.allclose(have, want, rtol=1e-5, atol=0.0):
            worst = float(np.max(np.maximum(have / want, want / have)))
            out.append(
                Violation(
                    name,
                    "bias scale",
                    f"input scale x weight scale of {consumer.name}",
                    f"a scale off by up to {worst:.3g}x",
                )
            )
    return out


def _check_zero_point(
    node: onnx.NodeProto, name: str, g: Scope, profile: BackendProfile, zp_name: str
) -> list[Violation]:
    if not zp_name:
        output_dtype = ir.node_attrs(node).get("output_dtype")  # opset 21 names the type
        if output_dtype:
            dtype = TensorProto.DataType.Name(int(output_dtype)).lower()
            if dtype in profile.allowed_qdq_dtypes:
                return []
            allowed = " or ".join(sorted(profile.allowed_qdq_dtypes))
            return [Violation(name, "output_dtype", allowed, dtype)]
        if node.op_type == "QuantizeLinear" and "uint8" not in profile.allowed_qdq_dtypes:
            return [
                Violation(
                    name,
                    "zero_point",
                    "an int8 zero point",
                    "absent (QuantizeLinear then produces uint8)",
                )
            ]
        return []
    zp = g.const_value(zp_name)
    elem = g.elem_type(zp_name)
    dtype = TensorProto.DataType.Name(elem).lower() if elem else "unknown"
    out = []
    if zp is None:
        out.append(Violation(name, "zero_point", "a constant", f"non-constant {zp_name!r}"))
    if dtype not in profile.allowed_qdq_dtypes:
        out.append(
            Violation(
                name, "zero_point dtype", " or ".join(sorted(profile.allowed_qdq_dtypes)), dtype
            )
        )
    if zp is not None and profile.activation_symmetric and np.any(zp != 0):
        out.append(
            Violation(name, "zero_point", "0 (symmetric)", f"{np.unique(zp).ravel()[:3].tolist()}")
        )
    return out


def _check_per_axis(
    node: onnx.NodeProto, name: str, g: Scope, profile: BackendProfile, axis: int, n_scales: int
) -> list[Violation]:
    data = node.input[0]
    weight = data
    if not g.is_const(data):
        producer = g.producer.get(data)
        if (
            producer is not None
            and producer.op_type == "QuantizeLinear"
            and g.is_const(producer.input[0])
        ):
            weight = producer.input[0]
        elif not profile.per_axis_activations:
            return [
                Violation(
                    name,
                    "scale",
                    "per-tensor for an activation",
                    f"{n_scales} per-axis scales on non-constant {data!r}",
                )
            ]
    out = []
    shape = g.shape(weight)
    if shape is not None and shape:
        ax = axis % len(shape)
        if isinstance(shape[ax], int) and shape[ax] != n_scales:
            out.append(
                Violation(name, "scale count", f"dim[{ax}] = {shape[ax]}", f"{n_scales} scales")
            )
        out.extend(_check_weight_axis(node, name, g, profile, ax, len(shape)))
    return out


def _check_weight_axis(
    node: onnx.NodeProto, name: str, g: Scope, profile: BackendProfile, axis: int, rank: int
) -> list[Violation]:
    """The axis of a per-channel weight must be the output-channel axis of its consumer."""
    tensor = node.output[0]
    if node.op_type == "QuantizeLinear":  # Q -> DQ on a float weight: look behind the DQ
        readers = g.consumers.get(tensor, [])
        if len(readers) != 1:
            return []
        tensor = readers[0][0].output[0]
    out = []
    for consumer, index in g.consumers.get(tensor, []):
        spec = profile.weight_axes.get(consumer.op_type)
        if spec is None or index != spec.input_index:
            continue
        want = spec.resolve(ir.node_attrs(consumer), rank)  # type: ignore[arg-type]
        if want != axis:
            out.append(
                Violation(
                    name,
                    "axis",
                    f"{want} (output channels of {consumer.op_type} {consumer.name})",
                    str(axis),
                )
            )
    return out
