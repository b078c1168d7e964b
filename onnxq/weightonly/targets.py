"""Which layers get weight-only quantization, in what format, and why the others do not.

A layer is a MatMul whose right-hand side is a constant 2-D float32 weight, a Gemm with a
constant 2-D float32 B (``transA=0``), or, where the backend runs quantized tables, a Gather
from a constant 2-D float32 table along axis 0 (an embedding).  Its weight is seen as
``W[K, N]``: K the axis it sums over (for a table ``[V, H]``: K = H, the row).

Layers are taken from the top-level graph.  Those inside If/Loop/Scan bodies stay float, with
the reason in the report: the layer-by-layer pass cuts the top-level graph into stages and
measures each layer's input once per batch, while a body's layer runs any number of times per
batch (or never), and language models, what weight-only quantization is for, keep their
layers at the top level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.overrides import Override
from onnxq.config.placement import PlacementOptions
from onnxq.config.weightonly import WeightOnlyOptions
from onnxq.errors import ConfigError
from onnxq.numerics.blocks import BlockFormat
from onnxq.place.heads import head_nodes

DEFAULT_BLOCK = 128
# measured defaults (docs/weight-only.md): a model's head (an LM's lm_head, read by the
# output through nothing but data movement) keeps 8 bits; embedding tables keep 8 bits
HEAD_BITS = 8
EMBEDDING_BITS = 8
IN_BODY = (
    "inside a control-flow body (If/Loop/Scan): weight-only layers are taken from the "
    "top-level graph, where their inputs are measured once per batch"
)


@dataclass(frozen=True)
class Layer:
    """One weight-only layer: its node, weight, input (None for a table) and format."""

    node: str
    op_type: str
    weight: str
    activation: str | None
    k: int
    n: int
    transposed: bool  # the stored weight is [N, K] (Gemm transB=1, an embedding table)
    fmt: BlockFormat
    algorithm: str
    why: str  # how the format was chosen ("default", "head", an override, ...)
    wide: BlockFormat | None = None  # the 8-bit format the backend runs, for a promotion


@dataclass(frozen=True)
class Skipped:
    """A weighted op left float, and why."""

    node: str
    op_type: str
    reason: str


def find_layers(
    graph: ir.Graph,
    profile: BackendProfile,
    options: WeightOnlyOptions,
    placement: PlacementOptions,
) -> tuple[list[Layer], list[Skipped]]:
    """The layers of ``graph`` to quantize, in graph order, and the weighted ops left float
    with reasons (those inside control-flow bodies among them): their formats from the
    weight-only section ``options``, what stays float and the overrides from ``placement``
    (its ``exclude`` and ``overrides``)."""
    fmt = profile.weight_only
    assert fmt is not None
    heads = head_nodes(graph)
    layers: list[Layer] = []
    skipped: list[Skipped] = []
    for scope in ir.scopes(graph):
        for node in scope.nodes:
            if node.op_type not in ("MatMul", "Gemm") and node.op_type not in fmt.embedding_ops:
                continue
            shape = _weight_shape(scope, node)
            if isinstance(shape, str):
                if shape:
                    skipped.append(Skipped(node.name, node.op_type, shape))
            elif scope is not graph:
                skipped.append(Skipped(node.name, node.op_type, IN_BODY))
            else:
                found = _top_level_layer(
                    graph, node, shape, profile, options, placement, node.name in heads
                )
                if isinstance(found, Layer):
                    layers.append(found)
                else:
                    skipped.append(found)
    return layers, skipped


def _top_level_layer(
    graph: ir.Graph,
    node: onnx.NodeProto,
    shape: tuple[int, int],
    profile: BackendProfile,
    options: WeightOnlyOptions,
    placement: PlacementOptions,
    head: bool,
) -> Layer | Skipped:
    """The layer of a weighted top-level ``node``, or why it stays float."""
    excluded = placement.node_excluded(node.name, node.op_type)
    if excluded:
        return Skipped(node.name, node.op_type, f"excluded by {excluded}")
    return _layer(graph, node, shape, profile, options, placement.overrides, head)


def _weight_shape(graph: ir.Graph, node: onnx.NodeProto) -> tuple[int, int] | str:
    """The stored weight's 2-D shape, or why the node is no layer ("" : not a weighted op)."""
    if node.op_type == "Gather":
        if int(ir.node_attrs(node).get("axis", 0)) != 0:
            return "a Gather along an axis other than 0 (not an embedding lookup)"
        index = 0
    else:
        if node.op_type == "Gemm" and ir.node_attrs(node).get("transA", 0):
            return "Gemm with transA=1 (the weight-only kernels take A as it is)"
        index = 1
    if len(node.input) <= index or not graph.is_const(node.input[index]):
        return ""  # two activations (attention scores): not a weighted op
    name = node.input[index]
    if node.op_type != "Gather" and graph.is_const(node.input[0]):
        return "both inputs are constants"
    if graph.elem_type(name) != onnx.TensorProto.FLOAT:
        return f"its weight {name!r} is not float32 (quantize the float32 model)"
    shape = graph.shape(name)
    if shape is None or len(shape) != 2 or not all(isinstance(d, int) and d > 0 for d in shape):
        return f"its weight {name!r} is not 2-D ({list(shape or [])}): batched weights stay float"
    return int(shape[0]), int(shape[1])  # type: ignore[arg-type]


def _layer(
    graph: ir.Graph,
    node: onnx.NodeProto,
    shape: tuple[int, int],
    profile: BackendProfile,
    options: WeightOnlyOptions,
    overrides: tuple[Override, ...],
    head: bool,
) -> Layer | Skipped:
    attrs = ir.node_attrs(node)
    if node.op_type == "Gather":
        transposed, weight, activation = True, node.input[0], None
    else:
        transposed = node.op_type == "Gemm" and bool(attrs.get("transB", 0))
        weight, activation = node.input[1], node.input[0]
    k, n = (shape[1], shape[0]) if transposed else shape
    bits, block, algorithm, why = _settings(node, weight, options, overrides, head)
    fmt = profile.weight_only
    assert fmt is not None
    if bits not in fmt.bits:
        return Skipped(node.name, node.op_type, f"{bits}-bit weights do not run on {profile.name}")
    if block and bits not in fmt.blocked_bits:
        block, why = 0, f"{why}; {profile.name} runs {bits}-bit weights per channel only"
    symmetric = options.weight_symmetric or fmt.symmetric_only
    return Layer(
        node.name,
        node.op_type,
        weight,
        activation,
        k,
        n,
        transposed,
        BlockFormat(bits, block or None, symmetric),
        algorithm if activation is not None else "rtn",
        why,
        BlockFormat(8, (block or None) if 8 in fmt.blocked_bits else None, symmetric),
    )


def _settings(
    node: onnx.NodeProto,
    weight: str,
    options: WeightOnlyOptions,
    overrides: tuple[Override, ...],
    head: bool,
) -> tuple[int, int, str, str]:
    """Bits, block size (0: per channel), algorithm and why, from the weight-only section, the
    measured defaults and the overrides (the later override wins field by field)."""
    bits = 4 if options.weight_only == "int4" else 8
    why = "default"
    if options.weight_only == "int4" and head:
        bits, why = HEAD_BITS, "model head: kept at 8 bits (measured default)"
    elif options.weight_only == "int4" and node.op_type == "Gather":
        bits, why = EMBEDDING_BITS, "embedding table: kept at 8 bits (measured default)"
    block = options.block_size
    if block is None:  # int4: blocks of 128; int8: per output channel
        block = DEFAULT_BLOCK if bits == 4 else 0
    algorithm = options.weight_algorithm
    for ov in overrides:
        if not (ov.matches_node(node.name, node.op_type) or ov.matches_tensor(weight)):
            continue
        if ov.bits is not None:
            if ov.bits not in (4, 8):
                raise ConfigError(
                    f"override matching {node.name!r}: bits={ov.bits}; weight-only layers take "
                    "4 or 8 bits (exclude: true keeps a layer float)"
                )
            bits, why = ov.bits, "override"
        if ov.block_size is not None:
            block, why = ov.block_size, "override"
        if ov.algorithm is not None:
            algorithm = ov.algorithm
    if node.op_type == "Gather" and not block:  # tables are stored block-wise only
        block = DEFAULT_BLOCK
    return bits, block, algorithm, why


def weight_matrix(graph: ir.Graph, layer: Layer) -> np.ndarray:
    """The layer's weight as ``W[K, N]`` (float32; read from disk when it was left there)."""
    tensor = graph.initializers.get(layer.weight)
    # read past Graph's cache: every weight of a large model would stay in it
    value = (
        ir.external.tensor_array(tensor) if tensor is not None else graph.const_value(layer.weight)
    )
    assert value is not None
    value = np.asarray(value, np.float32)
    return np.ascontiguousarray(value.T) if layer.transposed else value
