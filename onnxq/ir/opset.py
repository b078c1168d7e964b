"""The default-domain opset and IR version of a model: upgrading an old opset (with what onnx's
converter misses), lowering the IR version where nothing is lost, and what loading changed."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from onnxq.errors import UnsupportedModelError, first_line
from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.order import attr_graphs
from onnxq.ir.weightless import restore_weights, weights_stripped


@dataclass(frozen=True)
class OpsetUpgrade:
    """The default-domain opset a model came with and the one onnxq converted it to."""

    from_opset: int
    to_opset: int


@dataclass
class LoadRecord:
    """What loading changed in a model, as data (the report's notes say it in words)."""

    sorted_nodes: bool = False  # the nodes were not in topological order; onnxq sorted them
    opset_upgrade: OpsetUpgrade | None = None
    # an FP16/BF16 model's inputs and outputs -> their element type, before onnxq widened
    # the model to FP32 (onnxq.prepare.upcast); the output gets them back
    half_io: dict[str, int] = field(default_factory=dict)
    widened: tuple[str, ...] = ()  # the half types (float16, bfloat16) it was widened from


def upgrade_opset(
    model: onnx.ModelProto, min_opset: int, where: str = "model", record: LoadRecord | None = None
) -> onnx.ModelProto:
    """Convert the default-domain opset up to ``min_opset`` (per-axis Q/DQ needs 13); say so
    in ``record``, when given."""
    current = opset_version(model)
    if current >= min_opset:
        return model
    from onnx import version_converter

    if current < 7:
        _per_channel_prelu_slopes(model)
    try:
        with weights_stripped(model) as light:
            converted = version_converter.convert_version(light, min_opset)
            restored = restore_weights(converted, model)
    except Exception as exc:
        raise UnsupportedModelError(
            f"{where}: opset {current} is below {min_opset}, which {opset_purpose(min_opset)} "
            f"needs, and the upgrade failed ({first_line(exc)}); re-export the model with "
            f"opset >= {min_opset}"
        ) from None
    _restore_node_metadata(model.graph, restored.graph)
    if record is not None:
        record.opset_upgrade = OpsetUpgrade(current, min_opset)
    return restored


def _restore_node_metadata(original: onnx.GraphProto, converted: onnx.GraphProto) -> None:
    """onnx's version converter keeps node names but drops their ``metadata_props`` (the
    exporter's module scopes, which ``exclude_modules`` reads): copy them back by name, in
    control-flow bodies too."""
    props = {n.name: n for n in original.node if n.name and n.metadata_props}
    for node in converted.node:
        source = props.get(node.name)
        if source is not None and not node.metadata_props:
            node.metadata_props.extend(source.metadata_props)
    bodies = {(n.name, a.name): a for n in original.node if n.name for a in n.attribute}
    for node in converted.node:
        for attr in node.attribute:
            before = bodies.get((node.name, attr.name))
            if before is None:
                continue
            if attr.type == onnx.AttributeProto.GRAPH:
                _restore_node_metadata(before.g, attr.g)
            for old, new in zip(before.graphs, attr.graphs, strict=False):
                _restore_node_metadata(old, new)


def opset_purpose(opset: int) -> str:
    """What needs the opset onnxq converts a model to (BF16 forms of the ops from 22, INT4 and
    16-bit Q/DQ from 21, FP16 and FP8 Q/DQ from 19, per-channel Q/DQ from 13)."""
    if opset >= 22:
        return "BF16 compute"
    if opset >= 21:
        return "INT4 / 16-bit Q/DQ"
    return "FP16 or FP8 Q/DQ" if opset >= 19 else "per-channel Q/DQ"


def _per_channel_prelu_slopes(model: onnx.ModelProto) -> None:
    """Before opset 7, a PRelu's 1-D slope of C values is one slope per channel (axis 1); from
    opset 7 on it broadcasts against the last axis, and onnx's version converter leaves it as it
    is.  Give such a constant slope the shape [C, 1, ..., 1] of the input's rank, so that the
    converted model computes what the original does."""
    prelus = [
        n
        for n in model.graph.node
        if n.op_type == "PRelu" and n.domain in ("", "ai.onnx") and len(n.input) == 2
    ]
    if not prelus:
        return
    with weights_stripped(model) as light:
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
        except Exception:
            return
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in (*inferred.graph.input, *inferred.graph.value_info)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    }
    constants = {t.name: t for t in model.graph.initializer}
    constants.update(
        {
            n.output[0]: n.attribute[0].t
            for n in model.graph.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
        }
    )
    declared = {vi.name: vi for vi in model.graph.input}  # IR < 4 lists weights as inputs
    for node in prelus:
        slope, rank = constants.get(node.input[1]), ranks.get(node.input[0], 0)
        if slope is None or len(slope.dims) != 1 or slope.dims[0] < 2 or rank < 3:
            continue
        slope.dims[:] = [slope.dims[0], *[1] * (rank - 2)]
        if node.input[1] in declared and declared[node.input[1]].type.HasField("tensor_type"):
            shape = declared[node.input[1]].type.tensor_type.shape
            del shape.dim[:]
            for d in slope.dims:
                shape.dim.add().dim_value = d


def drop_initializer_inputs(model: onnx.ModelProto) -> list[str]:
    """Stop listing initializers among the graph inputs; returns their names.

    IR < 4 required every initializer to be a graph input; from IR 4 on, such an input is an
    overridable default, which keeps onnxruntime from folding it or fusing it into an integer
    kernel.  A quantized model fixes its weights either way, so they become plain weights.  An
    IR version older than the model's opsets need (an opset upgrade leaves it as it was) is
    raised to the oldest that fits, else the Q/DQ constants added later would make an IR 3
    model invalid.
    """
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    dropped = [vi.name for vi in graph.input if vi.name in weights]
    if dropped:
        kept = [vi for vi in graph.input if vi.name not in weights]
        del graph.input[:]
        graph.input.extend(kept)
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if model.ir_version < max(4, needed):
        model.ir_version = max(4, needed)
    return dropped


# element types every IR version from 4 on knows (newer IR versions add 8-, 4- and 2-bit types)
_CLASSIC_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.UINT8,
        TensorProto.INT8,
        TensorProto.UINT16,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.STRING,
        TensorProto.BOOL,
        TensorProto.FLOAT16,
        TensorProto.DOUBLE,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.COMPLEX64,
        TensorProto.COMPLEX128,
        TensorProto.BFLOAT16,
    }
)


def lower_ir_version(model: onnx.ModelProto, version: int) -> bool:
    """Stamp ``model`` with IR ``version`` (lower than its own) when that loses nothing: every
    element type it uses existed then, and it has no local functions (their overloads came
    with IR 10).  Returns whether it did."""
    if model.ir_version <= version or version < 4 or (model.functions and version < 10):
        return False
    if not _element_types(model.graph) <= _CLASSIC_TYPES:
        return False
    model.ir_version = version
    return True


_TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})  # Cast, Random*/EyeLike, Q/DQ-21


def _element_types(graph: onnx.GraphProto) -> set[int]:
    """Every tensor element type a graph (and its subgraphs) declares, stores or casts to."""
    found: set[int] = set()
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type"):
            found.add(vi.type.tensor_type.elem_type or TensorProto.FLOAT)
        elif vi.type.WhichOneof("value") is not None:
            found.add(-1)  # sequences, maps, optionals: leave such a model as it is
    found.update(t.data_type for t in graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                found.add(attr.t.data_type)
            elif attr.name in _TYPE_ATTRS and attr.type == onnx.AttributeProto.INT:
                found.add(int(attr.i))
            for sub in attr_graphs(attr):
                found |= _element_types(sub)
    return found


def opset_version(model: onnx.ModelProto) -> int:
    """The default-domain opset of a model."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 1


def set_opset(model: onnx.ModelProto, version: int) -> None:
    """Raise the default-domain opset import to ``version`` (never lowers)."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            imp.version = max(int(imp.version), version)
            return
    model.opset_import.add(domain="", version=version)


def set_domain_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """Import ``domain`` (e.g. onnxruntime's ``com.microsoft``) at ``version`` or later."""
    for imp in model.opset_import:
        if imp.domain == domain:
            imp.version = max(int(imp.version), version)
            return
    model.opset_import.add(domain=domain, version=version)
