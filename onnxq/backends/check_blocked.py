"""Checks of weight-only layers: blocked DequantizeLinear (opset 21 ``block_size``) and
onnxruntime's MatMulNBits / GatherBlockQuantized, against the profile's
:class:`~onnxq.backends.weight_only_format.WeightOnlyFormat`.  Called by
:func:`onnxq.backends.check.check`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.backends.weight_only_format import WeightOnlyFormat
from onnxq.errors import Violation

_BITS: dict[int, tuple[int, bool]] = {
    TensorProto.INT4: (4, True),
    TensorProto.UINT4: (4, False),
    TensorProto.INT8: (8, True),
    TensorProto.UINT8: (8, False),
}


def is_blocked(node: onnx.NodeProto) -> bool:
    """A DequantizeLinear with a non-zero ``block_size``."""
    return node.op_type == "DequantizeLinear" and bool(ir.node_attrs(node).get("block_size", 0))


def check_blocked_dq(
    node: onnx.NodeProto, name: str, g: Any, profile: BackendProfile, opset: int
) -> list[Violation]:
    """A blocked DequantizeLinear: a constant weight of an allowed width, block size and
    symmetry, a scale (and zero point) of the weight's rank with ``ceil(dim / block)`` along the
    blocked axis, that axis being the one its MatMul/Gemm sums over."""
    fmt = profile.weight_only
    attrs = ir.node_attrs(node)
    block, axis = int(attrs["block_size"]), int(attrs.get("axis", 1))
    if fmt is None:
        return [
            Violation(
                name, "block_size", f"no blocked DequantizeLinear on {profile.name}", str(block)
            )
        ]
    v: list[Violation] = []
    if opset < fmt.blocked_opset:
        v.append(Violation(name, "opset", f">= {fmt.blocked_opset} for block_size", str(opset)))
    data = node.input[0]
    if not g.is_const(data):
        v.append(Violation(name, "input", "a constant weight (blocks are weight-only)", repr(data)))
    width = _BITS.get(g.elem_type(data) or 0)
    if width is None or width[0] not in fmt.blocked_bits:
        got = TensorProto.DataType.Name(g.elem_type(data) or 0).lower()
        v.append(Violation(name, "dtype", _widths(fmt.blocked_bits), got))
    elif fmt.symmetric_only and not width[1]:
        v.append(Violation(name, "dtype", "signed (symmetric)", "unsigned"))
    if not _block_ok(block, fmt):
        v.append(Violation(name, "block_size", _blocks(fmt), str(block)))
    shape = g.shape(data)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return v
    rank = len(shape)
    axis %= max(rank, 1)
    want = tuple(-(-d // block) if i == axis else d for i, d in enumerate(shape))
    for label, tensor in (("scale", node.input[1]), ("zero_point", _input(node, 2))):
        if not tensor:
            continue
        value = g.const_value(tensor)
        if value is None:
            v.append(Violation(name, label, "a constant", f"non-constant {tensor!r}"))
            continue
        if tuple(value.shape) != want:
            v.append(Violation(name, f"{label} shape", str(list(want)), str(list(value.shape))))
        if label == "scale" and (not np.all(np.isfinite(value)) or np.any(value <= 0)):
            v.append(
                Violation(name, "scale", "> 0 and finite", "a non-positive or non-finite value")
            )
        if label == "zero_point" and fmt.symmetric_only and np.any(value != 0):
            v.append(Violation(name, "zero_point", "0 (symmetric)", "non-zero values"))
    v.extend(_reduction_axis(node, name, g, profile, axis, rank))
    return v


def _reduction_axis(
    node: onnx.NodeProto, name: str, g: Any, profile: BackendProfile, axis: int, rank: int
) -> list[Violation]:
    """Blocks run along the axis the reading MatMul/Gemm sums over (its input channels)."""
    out = []
    for consumer, index in g.consumers.get(node.output[0], []):
        spec = profile.weight_axes.get(consumer.op_type)
        if spec is None or index != spec.input_index or rank != 2:
            continue
        want = 1 - spec.resolve(ir.node_attrs(consumer), rank)
        if want != axis:
            out.append(
                Violation(
                    name,
                    "axis",
                    f"{want} (input channels of {consumer.op_type} {consumer.name})",
                    str(axis),
                )
            )
    return out


def check_weight_only_op(
    node: onnx.NodeProto, name: str, g: Any, profile: BackendProfile
) -> list[Violation]:
    """MatMulNBits / GatherBlockQuantized: constant packed weights and scales of the sizes
    their attributes give, an allowed width and block size."""
    fmt = profile.weight_only
    attrs = ir.node_attrs(node)
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
    if fmt is None or fmt.writer != "matmul_nbits":
        return [Violation(name, "op_type", f"no {node.op_type} on {profile.name}", node.op_type)]
    v = []
    if bits not in fmt.blocked_bits:
        v.append(Violation(name, "bits", _widths(fmt.blocked_bits), str(bits)))
    if not _block_ok(block, fmt):
        v.append(Violation(name, "block_size", _blocks(fmt), str(block)))
    weight = node.input[1] if node.op_type == "MatMulNBits" else node.input[0]
    for label, tensor in (("weight", weight), ("scales", node.input[2])):
        if not g.is_const(tensor):
            v.append(Violation(name, label, "a constant", f"non-constant {tensor!r}"))
    if fmt.symmetric_only and _input(node, 3):
        v.append(Violation(name, "zero_points", "absent (symmetric)", "present"))
    if node.op_type == "MatMulNBits" and not v:
        v.extend(_nbits_shapes(node, name, g, attrs, bits, block))
    return v


def _nbits_shapes(
    node: onnx.NodeProto, name: str, g: Any, attrs: dict[str, Any], bits: int, block: int
) -> list[Violation]:
    k, n = int(attrs.get("K", 0)), int(attrs.get("N", 0))
    blocks = -(-k // block) if block else 0
    v = []
    want = [n, blocks, block * bits // 8]
    got = g.shape(node.input[1])
    if got is not None and list(got) != want:
        v.append(Violation(name, "B shape", str(want), str(list(got))))
    scales = g.const_value(node.input[2])
    if scales is not None and scales.size != n * blocks:
        v.append(Violation(name, "scales size", str(n * blocks), str(scales.size)))
    return v


def _block_ok(block: int, fmt: WeightOnlyFormat) -> bool:
    if fmt.block_sizes:
        return block in fmt.block_sizes
    return block >= fmt.min_block_size and block & (block - 1) == 0


def _blocks(fmt: WeightOnlyFormat) -> str:
    if fmt.block_sizes:
        return " or ".join(str(b) for b in sorted(fmt.block_sizes))
    return f"a power of two >= {fmt.min_block_size}"


def _widths(bits: frozenset[int]) -> str:
    return " or ".join(f"{b}-bit" for b in sorted(bits))


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""
