"""Weight-only layers: the writer of MatMulNBits, GatherBlockQuantized and blocked
DequantizeLinear nodes (the weight-only half of :mod:`onnxq.materialize.qdq`).

Input: per layer its node, its constant weight and the integer codes the weight-only algorithms
chose (``onnxq.weightonly``), in the ``[K, N]`` orientation of :mod:`onnxq.numerics.blocks`
(K: the axis the layer sums over; for an embedding table ``[V, H]``, K is H).  What is written
comes from the backend profile's :class:`~onnxq.backends.weight_only_format.WeightOnlyFormat`:

* ``matmul_nbits`` (onnxruntime): MatMul and Gemm with block-wise weights become
  ``com.microsoft.MatMulNBits`` (codes packed along K in blocks of a power of two), Gather
  becomes ``GatherBlockQuantized``; a per-channel weight is written as below, and onnxruntime
  fuses that DequantizeLinear -> MatMul into MatMulNBits itself when it loads the model;
* ``dequantize_linear`` (TensorRT): the weight becomes an int4/int8 initializer behind a
  DequantizeLinear (opset 21 ``block_size`` along K for blocks, ``axis`` on the output channels
  per channel), read by the unchanged MatMul/Gemm.

Activation-aware scales (AWQ) divide the layer's input channel-wise: folded into a constant Mul
that produces the input when nothing else reads it (a normalisation's weight), else one Mul
node per input tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.errors import InternalError
from onnxq.materialize.input_scales import scaled_input
from onnxq.numerics.blocks import BlockQuantized

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class WeightOnlyLayer:
    """One layer to write: ``node`` reads constant ``weight``, stored as ``codes``; its input is
    divided by ``input_scale`` (per input channel, AWQ) when given."""

    node: str
    weight: str
    codes: BlockQuantized
    input_scale: np.ndarray | None = None


def materialize_weight_only(
    model: onnx.ModelProto,
    layers: list[WeightOnlyLayer],
    profile: BackendProfile,
    accuracy_level: int = 0,
) -> int:
    """Write ``layers`` into ``model`` (edited in place) as ``profile`` runs them; returns the
    bytes of the weights as stored (codes, scales, zero points)."""
    fmt = profile.weight_only
    if fmt is None:
        raise InternalError(f"backend {profile.name} has no weight-only format")
    graph = ir.Graph(model)
    before = {t.name for t in model.graph.initializer}
    by_name = {n.name: n for n in graph.nodes}
    written: dict[str, Any] = {}  # weight -> stored tensors (shared weights)
    scaled: dict[tuple[str, bytes], str] = {}
    doomed = []
    for layer in layers:
        node = by_name[layer.node]
        if layer.input_scale is not None:
            ours = {
                other.node
                for other in layers
                if other.input_scale is not None
                and np.array_equal(other.input_scale, layer.input_scale)
            }
            graph.set_input(node, 0, scaled_input(graph, node, layer.input_scale, ours, scaled))
        if fmt.writer == "matmul_nbits" and (
            layer.codes.fmt.block_size or node.op_type == "Gather"
        ):
            _write_ms(graph, node, layer, written, accuracy_level)
            doomed.append(node)
        else:
            _write_dq(graph, node, layer, written)
    graph.remove_nodes(doomed)
    graph.commit()
    ms_ops = any(n.domain == MS_DOMAIN for n in model.graph.node)
    if ms_ops and not any(imp.domain == MS_DOMAIN for imp in model.opset_import):
        model.opset_import.add(domain=MS_DOMAIN, version=1)
    if any(
        ir.node_attrs(n).get("block_size")
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
    ):
        ir.set_opset(model, fmt.blocked_opset)
    elif any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        ir.set_opset(model, 13)
    return sum(
        len(t.raw_data)
        for t in model.graph.initializer
        if t.name not in before and not t.name.endswith("_awq_scale")
    )


# ----------------------------------------------------------------------- onnxruntime ops
def _write_ms(
    graph: ir.Graph,
    node: onnx.NodeProto,
    layer: WeightOnlyLayer,
    written: dict[str, Any],
    accuracy_level: int,
) -> None:
    """Replace ``node`` by MatMulNBits / GatherBlockQuantized (the caller removes it)."""
    if node.op_type == "Gather":
        _write_gather(graph, node, layer, written)
    else:
        _write_matmul_nbits(graph, node, layer, written, accuracy_level)


def _write_gather(
    graph: ir.Graph, node: onnx.NodeProto, layer: WeightOnlyLayer, written: dict[str, Any]
) -> None:
    """An embedding's Gather as GatherBlockQuantized (its table stored once)."""
    codes = layer.codes
    stored = written.get(layer.weight) or _store_gather(graph, layer)
    written[layer.weight] = stored
    data, scales, zero = stored
    rows = codes.fmt.rows(codes.q.shape[0])
    graph.add_node(
        "GatherBlockQuantized",
        [data, node.input[1], scales, *([zero] if zero else [])],
        list(node.output),
        graph.unique_name(f"{node.name}_GatherBlockQuantized"),
        domain=MS_DOMAIN,
        bits=codes.fmt.bits,
        block_size=rows,
        gather_axis=0,
        quantize_axis=1,
    )


def _write_matmul_nbits(
    graph: ir.Graph,
    node: onnx.NodeProto,
    layer: WeightOnlyLayer,
    written: dict[str, Any],
    accuracy_level: int,
) -> None:
    """A MatMul or Gemm as MatMulNBits (its weight stored once per Gemm alpha), a Gemm's C
    that is no constant vector added after it."""
    codes = layer.codes
    attrs = ir.node_attrs(node)
    alpha = float(attrs.get("alpha", 1.0)) if node.op_type == "Gemm" else 1.0
    key = f"{layer.weight}@{alpha}@{codes.fmt}"
    stored = written.get(key) or _store_nbits(graph, layer, alpha)
    written[key] = stored
    blob, scales, zero, block = stored
    inputs = [node.input[0], blob, scales, zero or ""]
    bias = _gemm_bias(graph, node) if node.op_type == "Gemm" else None
    if bias is not None:
        inputs += ["", bias]
    while inputs and not inputs[-1]:
        inputs.pop()
    k, n = codes.q.shape
    out = node.output[0]
    extra = node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] and bias is None
    target = graph.unique_name(f"{out}_matmul") if extra else out
    graph.add_node(
        "MatMulNBits",
        inputs,
        [target],
        graph.unique_name(f"{node.name}_MatMulNBits"),
        domain=MS_DOMAIN,
        K=k,
        N=n,
        bits=codes.fmt.bits,
        block_size=int(block),
        accuracy_level=accuracy_level,
    )
    if extra:
        _add_gemm_c(graph, node, float(attrs.get("beta", 1.0)), target, out)


def _add_gemm_c(graph: ir.Graph, node: onnx.NodeProto, beta: float, product: str, out: str) -> None:
    """Gemm's C that is no constant vector: ``out = product + beta * C``, as Gemm would."""
    c = node.input[2]
    if beta != 1.0:
        factor = graph.add_initializer(
            graph.unique_name(f"{node.name}_beta"), np.asarray(beta, np.float32)
        )
        scaled_c = graph.unique_name(f"{c}_beta")
        graph.add_node("Mul", [c, factor], [scaled_c], graph.unique_name(f"{node.name}_beta_mul"))
        c = scaled_c
    graph.add_node("Add", [product, c], [out], graph.unique_name(f"{node.name}_bias_add"))


def _store_nbits(
    graph: ir.Graph, layer: WeightOnlyLayer, alpha: float
) -> tuple[str, str, str, int]:
    """The packed blob ``[N, blocks, block*bits/8]``, scales ``[N * blocks]`` and zero points
    of MatMulNBits; returns their names and the block size."""
    codes = layer.codes
    k, n = codes.q.shape
    bits = codes.fmt.bits
    block = codes.fmt.block_size or max(16, 1 << (k - 1).bit_length())
    blocks = -(-k // block)
    offset = 0 if codes.zero_point is not None else 2 ** (bits - 1)
    u = np.full((n, blocks * block), offset, np.uint8)
    u[:, :k] = (codes.q.T.astype(np.int16) + offset).astype(np.uint8)
    blob = _pack(u.reshape(n, blocks, block), bits)
    base = layer.weight
    names = [
        graph.add_initializer(graph.unique_name(f"{base}_nbits"), blob),
        graph.add_initializer(
            graph.unique_name(f"{base}_scales"),
            (codes.scale.T * np.float32(alpha)).astype(np.float32).reshape(-1),
        ),
    ]
    zero = ""
    if codes.zero_point is not None:
        zp = codes.zero_point.T.astype(np.uint8)  # [N, blocks]
        if bits == 4 and blocks % 2:
            zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
        zero = graph.add_initializer(
            graph.unique_name(f"{base}_zero_points"), _pack(zp, bits).reshape(-1)
        )
    return names[0], names[1], zero, block


def _store_gather(graph: ir.Graph, layer: WeightOnlyLayer) -> tuple[str, str, str]:
    """GatherBlockQuantized's data ``[V, H]`` (int4/uint4, or uint8 for 8 bits), scales
    ``[V, H / block]`` and zero points."""
    codes = layer.codes
    bits, sym = codes.fmt.bits, codes.zero_point is None
    base = layer.weight
    q = codes.q.T  # [V, H]
    if bits == 4:
        data = graph.add_tensor(packed_4bit(graph.unique_name(f"{base}_quantized"), q, signed=sym))
    else:
        data = graph.add_initializer(
            graph.unique_name(f"{base}_quantized"),
            (q.astype(np.int16) + (128 if sym else 0)).astype(np.uint8),
        )
    scales = graph.add_initializer(
        graph.unique_name(f"{base}_scales"), codes.scale.T.astype(np.float32)
    )
    zero = ""
    if not sym:
        zp = codes.zero_point.T  # type: ignore[union-attr]
        zero = (
            graph.add_tensor(packed_4bit(graph.unique_name(f"{base}_zero_points"), zp, False))
            if bits == 4
            else graph.add_initializer(
                graph.unique_name(f"{base}_zero_points"), zp.astype(np.uint8)
            )
        )
    return data, scales, zero


def _gemm_bias(graph: ir.Graph, node: onnx.NodeProto) -> str | None:
    """Gemm's ``beta * C`` as a MatMulNBits bias when C is a constant vector (else None)."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    c = graph.const_value(node.input[2])
    shape = graph.shape(node.input[1]) or (0, 0)
    n = int(shape[0] if ir.node_attrs(node).get("transB", 0) else shape[1])  # type: ignore[arg-type]
    if c is None or c.size != n or (c.ndim == 2 and c.shape[0] != 1) or c.ndim > 2:
        return None
    beta = float(ir.node_attrs(node).get("beta", 1.0))
    return graph.add_initializer(
        graph.unique_name(f"{node.input[2]}_bias"), (c.reshape(-1) * beta).astype(np.float32)
    )


def _pack(u: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes along the last axis, low bits first (8 bits: as they are)."""
    if bits == 8:
        return np.ascontiguousarray(u, dtype=np.uint8)
    if bits != 4:
        raise InternalError(f"no packing for {bits}-bit codes")
    return np.ascontiguousarray((u[..., 0::2] & 0xF) | ((u[..., 1::2] & 0xF) << 4), dtype=np.uint8)


def packed_4bit(name: str, codes: np.ndarray, signed: bool) -> TensorProto:
    """An INT4 (``signed``) or UINT4 TensorProto of ``codes``' shape: two codes a byte, the
    first in the low nibble, as ONNX stores 4-bit tensors."""
    flat = (np.asarray(codes).astype(np.int16).ravel() & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = TensorProto.INT4 if signed else TensorProto.UINT4
    tensor.dims.extend(codes.shape)
    tensor.raw_data = (flat[0::2] | (flat[1::2] << 4)).tobytes()
    return tensor


# ----------------------------------------------------------------------- DequantizeLinear
def _write_dq(
    graph: ir.Graph,
    node: onnx.NodeProto,
    layer: WeightOnlyLayer,
    written: dict[str, Any],
) -> None:
    """Point ``node``'s weight input at a DequantizeLinear of the integer weight."""
    index = 1 if node.op_type in ("MatMul", "Gemm") else 0
    if layer.weight not in written:
        written[layer.weight] = (_store_dq(graph, node, layer),)
    graph.set_input(node, index, written[layer.weight][0])


def _store_dq(graph: ir.Graph, node: onnx.NodeProto, layer: WeightOnlyLayer) -> str:
    codes = layer.codes
    fmt = codes.fmt
    transposed = node.op_type == "Gemm" and ir.node_attrs(node).get("transB", 0) == 1
    q = codes.q.T if transposed else codes.q  # the weight's own layout
    scale = codes.scale.T if transposed else codes.scale
    zero = (
        None
        if codes.zero_point is None
        else (codes.zero_point.T if transposed else codes.zero_point)
    )
    k_axis = 1 if transposed else 0
    base = layer.weight
    signed = zero is None
    if fmt.bits == 4:
        stored = graph.add_tensor(packed_4bit(graph.unique_name(f"{base}_quantized"), q, signed))
    else:
        dtype = np.int8 if signed else np.uint8
        stored = graph.add_initializer(graph.unique_name(f"{base}_quantized"), q.astype(dtype))
    inputs = [stored]
    if fmt.block_size is None:  # per output channel: a 1-D scale on the other axis
        attrs = {"axis": 1 - k_axis}
        scale = scale.reshape(-1)
        zero = None if zero is None else zero.reshape(-1)
    else:
        attrs = {"axis": k_axis, "block_size": fmt.block_size}
    inputs.append(
        graph.add_initializer(graph.unique_name(f"{base}_scale"), scale.astype(np.float32))
    )
    if zero is not None:
        if fmt.bits == 4:
            inputs.append(
                graph.add_tensor(packed_4bit(graph.unique_name(f"{base}_zero_point"), zero, False))
            )
        else:
            inputs.append(
                graph.add_initializer(
                    graph.unique_name(f"{base}_zero_point"), zero.astype(np.uint8)
                )
            )
    out = graph.unique_name(f"{base}_dequantized")
    graph.add_node(
        "DequantizeLinear", inputs, [out], graph.unique_name(f"{base}_DequantizeLinear"), **attrs
    )
    return out
