"""The checker's rules for element types and dynamic kernels, read from the precision table.

* Every Q/DQ pair: its element type (``onnxq.numerics.precisions.QTYPES``) must be one the opset (or
the
  node's domain) takes: FP8 from opset 19, 16-bit integers from opset 21 or in onnxruntime's
  ``com.microsoft`` domain.
* FP8 (TensorRT's recipe, docs/precisions.md): zero point 0; a weight stored in FP8 holds no
  NaN; a float weight behind QuantizeLinear has an amax-based scale (scale x 448 >= max |w| per
  channel: nothing saturates).
* onnxruntime's dynamic kernels (DynamicQuantizeMatMul, MatMulIntegerToFloat,
  DynamicQuantizeLSTM): constant 8-bit weights of the shapes the kernels read, scales > 0 with
  one per output column (gate row), or one.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import onnx

from onnxq import ir
from onnxq.errors import Violation
from onnxq.numerics.precisions import CONTRIB_DOMAIN, QType, qtype_of


class GraphScope(Protocol):
    """What the checker reads of a (sub)graph: constants, types, producers and consumers."""

    producer: dict[str, onnx.NodeProto]

    def const_value(self, name: str) -> Any: ...  # pragma: no cover
    def elem_type(self, name: str) -> int | None: ...  # pragma: no cover


def qdq_qtype(node: onnx.NodeProto, g: GraphScope) -> QType | None:
    """The element type a Q/DQ node works in: its zero point's, else a QuantizeLinear's
    ``output_dtype`` (opset 21) or uint8, else a DequantizeLinear's input type."""
    if len(node.input) > 2 and node.input[2]:
        elem = g.elem_type(node.input[2])
    elif node.op_type == "QuantizeLinear":
        elem = int(ir.node_attrs(node).get("output_dtype", 0)) or onnx.TensorProto.UINT8
    else:
        elem = g.elem_type(node.input[0])
    return qtype_of(elem) if elem else None


def check_qtype(node: onnx.NodeProto, name: str, g: GraphScope, opset: int) -> list[Violation]:
    """The element-type rules of one Q/DQ node (see the module docstring)."""
    qtype = qdq_qtype(node, g)
    if qtype is None:
        return []
    out = []
    if node.domain in ir.DEFAULT_DOMAINS and opset < qtype.min_opset:
        out.append(
            Violation(
                name,
                "opset",
                f">= {qtype.min_opset} for {qtype.name} QuantizeLinear/DequantizeLinear"
                + (f" (or the {qtype.contrib_domain} domain)" if qtype.contrib_domain else ""),
                f"opset {opset}",
            )
        )
    if node.domain == CONTRIB_DOMAIN and qtype.contrib_domain != CONTRIB_DOMAIN:
        out.append(
            Violation(name, "domain", f"the default domain for {qtype.name}", CONTRIB_DOMAIN)
        )
    if qtype.is_float:
        out.extend(_check_float(node, name, g, qtype))
    return out


def _check_float(node: onnx.NodeProto, name: str, g: GraphScope, qtype: QType) -> list[Violation]:
    out = []
    zp = g.const_value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if zp is not None and np.any(np.asarray(zp, dtype=np.float32) != 0):
        out.append(Violation(name, "zero_point", f"0 ({qtype.name} is symmetric)", "non-zero"))
    data = g.const_value(node.input[0])
    scale = g.const_value(node.input[1])
    if data is None or scale is None:
        return out
    values = np.asarray(data, dtype=np.float32)
    if node.op_type == "DequantizeLinear" and not np.all(np.isfinite(values)):
        out.append(Violation(name, "weight values", f"finite {qtype.name} values", "NaN"))
    if node.op_type == "QuantizeLinear" and values.size:
        axis = int(ir.node_attrs(node).get("axis", 1)) % max(values.ndim, 1)
        scale = np.asarray(scale, dtype=np.float64)
        if scale.ndim and scale.size > 1:
            peaks = np.abs(np.moveaxis(values, axis, 0).reshape(scale.size, -1)).max(axis=1)
        else:
            peaks = np.abs(values).max()
        if np.any(scale * qtype.qmax < peaks * (1 - 1e-6)):
            out.append(
                Violation(
                    name,
                    "scale",
                    f"amax-based (scale x {qtype.qmax:g} >= max |w| per channel)",
                    "a scale that saturates the weight",
                )
            )
    return out


# dynamic kernel -> (weight input, scale input, zero-point input, weight rank)
DYNAMIC_KERNELS: dict[str, tuple[int, int, int, int]] = {
    "DynamicQuantizeMatMul": (1, 2, 3, 2),
    "MatMulIntegerToFloat": (1, 3, 5, 2),
    "DynamicQuantizeLSTM": (1, 8, 9, 3),
}


def check_dynamic(node: onnx.NodeProto, name: str, g: GraphScope) -> list[Violation]:
    """The weight, scale and zero-point rules of one dynamic kernel (and an LSTM's R)."""
    w_index, s_index, z_index, rank = DYNAMIC_KERNELS[node.op_type]
    slots = [(w_index, s_index, z_index)]
    if node.op_type == "DynamicQuantizeLSTM":
        slots.append((2, 10, 11))
    out: list[Violation] = []
    for wi, si, zi in slots:
        out.extend(_check_dynamic_weight(node, name, g, wi, si, zi, rank))
    return out


def _check_dynamic_weight(
    node: onnx.NodeProto, name: str, g: GraphScope, wi: int, si: int, zi: int, rank: int
) -> list[Violation]:
    def arg(i: int) -> str:
        return node.input[i] if i < len(node.input) else ""

    weight = g.const_value(arg(wi)) if arg(wi) else None
    if weight is None or weight.dtype not in (np.int8, np.uint8) or weight.ndim != rank:
        got = "absent" if weight is None else f"{weight.dtype} of rank {weight.ndim}"
        return [Violation(name, f"input {wi}", f"a constant 8-bit weight of rank {rank}", got)]
    scale = g.const_value(arg(si)) if arg(si) else None
    if scale is None:
        return [Violation(name, f"input {si}", "a constant scale", "not a constant")]
    out = []
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        out.append(Violation(name, "scale", "> 0 and finite", "a zero, negative or NaN scale"))
    columns = weight.shape[-1]  # output columns (an LSTM's gate rows: 4 x hidden)
    allowed = {1, columns} if rank == 2 else {weight.shape[0], weight.shape[0] * columns}
    if scale.size not in allowed:
        out.append(
            Violation(name, "scale count", f"one of {sorted(allowed)}", f"{scale.size} scales")
        )
    zero = g.const_value(arg(zi)) if arg(zi) else None
    if arg(zi) and (zero is None or zero.size != scale.size):
        out.append(Violation(name, "zero_point", "a constant the size of the scale", "other"))
    return out
