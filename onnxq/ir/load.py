"""Reading models: safe external data, opset upgrade, shape inference, node names."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper

from onnxq.errors import ModelLoadError, UnsupportedModelError
from onnxq.ir import external, inline
from onnxq.ir.bodies import all_bodies, all_names, unique_node_names, unique_value_names
from onnxq.ir.constants import BIAS_READERS, DEFAULT_DOMAINS
from onnxq.ir.order import attr_graphs, topological_order


# ------------------------------------------------------------------------------- loading
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


def load_model(
    path: str | os.PathLike[str], min_opset: int = 13, record: LoadRecord | None = None
) -> onnx.ModelProto:
    """Read, check, upgrade (to ``min_opset``) and shape-infer a model file.  An upgrade
    and a topological sort are written into ``record``, when given (for the report).

    External data must lie inside the model's folder; anything else (``..``, absolute paths,
    symlinks that leave the folder) is refused before a byte of it is read.  From
    ``external.LAZY_BYTES`` of external data on, the weights stay on disk (lazy tensors, see
    :mod:`onnxq.ir.external`): the model then holds only the graph.
    """
    p = Path(path)
    if p.is_dir():
        raise ModelLoadError(f"{p} is a folder, not a model file; give the .onnx file")
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}")
    left: list[inline.LeftInFile] = []
    try:
        if p.stat().st_size >= external.LAZY_BYTES:  # inline weights stay in the file
            model, left = inline.read_light(p)
        else:
            model = onnx.load(str(p), load_external_data=False)
    except ModelLoadError:
        raise
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelLoadError(
            f"{p}: not a readable ONNX file ({type(exc).__name__}: {_first_line(exc)}); "
            "check that the file is complete and really is an ONNX model"
        ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{p}: the file parsed but holds no graph; is it an ONNX model?")
    base = p.resolve().parent
    for tensor in _external_tensors(model):
        _check_external_location(tensor, base, p)
    _load_external_data(model, base, p)
    _leave_in_file(model, left, p)
    _check_opset(model, str(p))
    _check_payloads(model, str(p))
    sort_nodes(model, record)
    check_model(model, where=str(p))
    model = upgrade_opset(model, min_opset, where=str(p), record=record)
    name_nodes(model.graph)
    unshare_biases(model.graph)
    return infer_shapes(model)


def _load_external_data(model: onnx.ModelProto, base: Path, p: Path) -> None:
    """Read the (checked) external data in, or, past :data:`external.LAZY_BYTES`, leave the
    top-level weights on disk as lazy tensors (``onnxq.ir.external``)."""
    lazy = _lazy_candidates(model, base, p)
    try:
        if not lazy:
            onnx.load_external_data_for_model(model, str(base))
            return
        for tensor, path, offset, length in lazy:
            external.make_lazy(tensor, path, offset, length)
        for tensor in _external_tensors(model):
            if not external.is_lazy(tensor):
                external_data_helper.load_external_data_for_tensor(tensor, str(base))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{p}: cannot read external data: {exc}") from None


def _leave_in_file(model: onnx.ModelProto, left: list[inline.LeftInFile], p: Path) -> None:
    """Make the initializers whose bytes :func:`inline.read_light` left in the model file lazy
    tensors of that file, once their length is checked against their shape and type."""
    path = p.resolve()
    for item in left:
        tensor = model.graph.initializer[item.index]
        if tensor.data_type in _PACKED_TYPES:  # sub-byte or string payloads: read them in
            with open(path, "rb") as fh:
                fh.seek(item.offset)
                tensor.raw_data = fh.read(item.length)
            continue
        want = _nbytes(tensor)
        if item.length != want:
            raise ModelLoadError(
                f"{p}: initializer {tensor.name!r} holds {item.length} bytes, its shape "
                f"{list(tensor.dims)} and type need {want}; the file is truncated or corrupt"
            )
        external.make_lazy(tensor, path, item.offset, item.length)


def _lazy_candidates(
    model: onnx.ModelProto, base: Path, p: Path
) -> list[tuple[TensorProto, Path, int, int]]:
    """Top-level external initializers to leave on disk: all of them when they hold at least
    ``LAZY_BYTES``, else none.  Each one's stored length must match its shape and type."""
    found = []
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL or tensor.data_type in _PACKED_TYPES:
            continue
        path, offset, length = _check_external_location(tensor, base, p)
        if length is None:
            length = path.stat().st_size - offset
        want = _nbytes(tensor)
        if length != want:
            raise ModelLoadError(
                f"{p}: initializer {tensor.name!r} holds {length} bytes, its shape "
                f"{list(tensor.dims)} and type need {want}; the file is truncated or corrupt"
            )
        found.append((tensor, path, offset, length))
    return found if sum(f[3] for f in found) >= external.LAZY_BYTES else []


def _check_opset(model: onnx.ModelProto, where: str) -> None:
    newest = onnx.defs.onnx_opset_version()
    version = opset_version(model)
    if version > newest:
        raise UnsupportedModelError(
            f"{where}: default-domain opset {version} is newer than this onnx knows "
            f"(up to {newest}); re-export with opset <= {newest} or upgrade onnx and onnxruntime"
        )


_TYPED_FIELDS = (
    "float_data",
    "int32_data",
    "int64_data",
    "double_data",
    "uint64_data",
    "string_data",
)


def _check_payloads(model: onnx.ModelProto, where: str) -> None:
    """Every weight's stored bytes must match its dims and type (a truncated or tampered file
    would otherwise fail much later, inside a rule)."""
    for tensor in _all_tensors(model.graph):
        n = int(np.prod(tensor.dims)) if tensor.dims else 1
        if tensor.HasField("raw_data"):
            want = n * _itemsize(tensor.data_type)
            got = len(tensor.raw_data)
            if got != want and tensor.data_type not in _PACKED_TYPES:
                raise ModelLoadError(
                    f"{where}: initializer {tensor.name!r} holds {got} bytes, its shape "
                    f"{list(tensor.dims)} and type need {want}; the file is truncated or corrupt"
                )
            continue
        counts = [len(getattr(tensor, f)) for f in _TYPED_FIELDS if len(getattr(tensor, f))]
        if (
            counts
            and n > 0
            and counts[0] not in (n, 2 * n)
            and tensor.data_type not in _PACKED_TYPES
        ):
            raise ModelLoadError(
                f"{where}: initializer {tensor.name!r} holds {counts[0]} values, its shape "
                f"{list(tensor.dims)} needs {n}; the file is corrupt"
            )


def check_model(model: onnx.ModelProto, where: str = "model") -> None:
    """``onnx.checker`` on the graph, without serialising the weights."""
    try:
        onnx.checker.check_model(_weightless_copy(model))
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(
            f"{where}: invalid ONNX graph: {_first_line(exc)}"
            f"{_runtime_extension_hint(model, str(exc))}"
        ) from None


# onnxruntime's own ops that its transformer optimizer writes into the ONNX domain (where ONNX
# defines them later or never), found in models from onnxruntime.transformers.optimizer
_RUNTIME_EXTENSIONS = {
    "LayerNormalization": 17,
    "SimplifiedLayerNormalization": None,
    "SkipSimplifiedLayerNormalization": None,
}


def _runtime_extension_hint(model: onnx.ModelProto, message: str) -> str:
    """Why a checker failure may come from an onnxruntime-optimized model, and what to do."""
    for op, since in _RUNTIME_EXTENSIONS.items():
        if f"No Op registered for {op} " not in message:
            continue
        defined = f"ONNX defines {op} from opset {since}" if since else f"ONNX does not define {op}"
        return (
            f" ({defined}: this looks like a model optimized for onnxruntime, e.g. by "
            "onnxruntime.transformers.optimizer, which only onnxruntime runs; quantize the "
            "model as exported, before that optimization"
            + (f", or export it at opset {since} or later)" if since else ")")
        )
    return ""


def _external_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            yield tensor


def _all_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            for sub in attr_graphs(attr):
                yield from _all_tensors(sub)


def _check_external_location(
    tensor: TensorProto, base: Path, model_path: Path
) -> tuple[Path, int, int | None]:
    """Refuse a location outside ``base`` or a range past the file's end; returns the resolved
    file, the offset and the length (``None`` when not given: to the end of the file)."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    where = f"{model_path}: initializer {tensor.name!r}"
    if not location:
        raise ModelLoadError(f"{where}: external data without a location")
    if "\0" in location:
        raise ModelLoadError(f"{where}: external data location contains a NUL byte; refused")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise ModelLoadError(
            f"{where}: external data location {location!r} is an absolute path; refused for "
            "safety (it must be a file inside the model's folder)"
        )
    try:
        resolved = (base / location).resolve()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{where}: external data location {location!r} cannot be resolved ({exc}); refused"
        ) from None
    if base != resolved and base not in resolved.parents:
        raise ModelLoadError(
            f"{where}: external data location {location!r} leaves the model's folder "
            f"(resolves to {resolved}); refused for safety"
        )
    if not resolved.is_file():
        raise ModelLoadError(
            f"{where}: external data file {location!r} not found next to the model; copy it "
            f"into {base}"
        )
    size = resolved.stat().st_size
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info.get("length", 0) or 0)
    except ValueError:
        raise ModelLoadError(
            f"{where}: external data offset/length {info.get('offset')!r}/"
            f"{info.get('length')!r} are not integers; the model file is corrupt"
        ) from None
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelLoadError(
            f"{where}: external data range {offset}+{length} is past the end of {location!r} "
            f"({size} bytes); the data file is truncated or belongs to another model"
        )
    return resolved, offset, (length if info.get("length") else None)


def sort_nodes(model: onnx.ModelProto, record: LoadRecord | None = None) -> None:
    """Put the top-level nodes in topological order, as ONNX requires and some exporters do
    not (onnxruntime sorts on its own and runs such a model); say so in ``record``.  A graph
    that cannot be sorted is left for the checker to name."""
    available = {vi.name for vi in model.graph.input} | {t.name for t in model.graph.initializer}
    if topological_order(model.graph, available) and record is not None:
        record.sorted_nodes = True


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
        with _weights_stripped(model) as light:
            converted = version_converter.convert_version(light, min_opset)
            restored = _restore_weights(converted, model)
    except Exception as exc:
        raise UnsupportedModelError(
            f"{where}: opset {current} is below {min_opset}, which {opset_purpose(min_opset)} "
            f"needs, and the upgrade failed ({_first_line(exc)}); re-export the model with "
            f"opset >= {min_opset}"
        ) from None
    if record is not None:
        record.opset_upgrade = OpsetUpgrade(current, min_opset)
    return restored


def opset_purpose(opset: int) -> str:
    """What needs the opset onnxq converts a model to (FP8 Q/DQ from 19, per-channel Q/DQ
    from 13)."""
    return "FP8 Q/DQ" if opset >= 19 else "per-channel Q/DQ"


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
    with _weights_stripped(model) as light:
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


# ai.onnx.ml ops whose output has their input's shape (element type: None = the input's),
# for which onnx has no shape inference: a scikit-learn pipeline's shapes stop at its Scaler
_ML_SAME_SHAPE = {
    "Scaler": onnx.TensorProto.FLOAT,
    "Normalizer": onnx.TensorProto.FLOAT,
    "Binarizer": None,
    "Imputer": None,
}


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that never serialises large weights (works past 2 GB), continued past
    the shape-preserving ``ai.onnx.ml`` ops onnx cannot read (:data:`_ML_SAME_SHAPE`)."""
    with _weights_stripped(model) as light:
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except Exception:  # inference is a help, not a requirement
            return model
        for _ in range(len(model.graph.node)):
            extra = _ml_same_shapes(inferred.graph)
            if not extra:
                break
            inferred.graph.value_info.extend(extra)
            try:
                inferred = onnx.shape_inference.infer_shapes(
                    inferred, strict_mode=False, data_prop=True
                )
            except Exception:  # keep what the first pass and the ML shapes gave
                break
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for dst, src in zip(model.graph.output, inferred.graph.output, strict=True):
        dst.CopyFrom(src)
    _copy_body_types(model.graph, inferred.graph)
    return model


def _copy_body_types(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    """The inferred types of the values inside control-flow bodies (same structure)."""
    pairs = list(zip(all_bodies(graph), all_bodies(inferred), strict=False))
    for body, done in pairs:
        if body.key != done.key or len(body.graph.output) != len(done.graph.output):
            return  # not the same structure: keep the model's own annotations
        del body.graph.value_info[:]
        body.graph.value_info.extend(done.graph.value_info)
        for dst, src in zip(body.graph.output, done.graph.output, strict=True):
            if src.type.HasField("tensor_type"):
                dst.CopyFrom(src)


def _ml_same_shapes(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Value infos for the outputs of :data:`_ML_SAME_SHAPE` ops whose input shape is known and
    whose own is not."""
    known = {
        vi.name: vi
        for vi in (*graph.input, *graph.value_info, *graph.output)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    }
    extra = []
    for node in graph.node:
        if (
            node.domain != "ai.onnx.ml"
            or node.op_type not in _ML_SAME_SHAPE
            or not node.input
            or node.input[0] not in known
            or not node.output
            or node.output[0] in known
        ):
            continue
        source = known[node.input[0]].type.tensor_type
        elem = _ML_SAME_SHAPE[node.op_type] or source.elem_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in source.shape.dim
        ]
        extra.append(onnx.helper.make_tensor_value_info(node.output[0], elem, dims))
    return extra


def shapes_for_inputs(
    model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int | str, ...]]:
    """Every tensor's shape when the graph inputs have these concrete shapes (best effort)."""
    with _weights_stripped(model) as light:
        for vi in light.graph.input:
            if vi.name in inputs and vi.type.HasField("tensor_type"):
                dims = vi.type.tensor_type.shape.dim
                del dims[:]
                for d in inputs[vi.name]:
                    dims.add().dim_value = int(d)
        del light.graph.value_info[:]
        for vi in light.graph.output:  # inferred afresh too: a model's declarations go stale
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except Exception:
            return {}
    out: dict[str, tuple[int | str, ...]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            out[vi.name] = tuple(
                d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                for d in vi.type.tensor_type.shape.dim
            )
    return out


_STRIP_BYTES = 1024
# sub-byte and packed element types whose byte count is not n * itemsize
_PACKED_TYPES = frozenset({TensorProto.STRING, 20, 21, 22, 23, 24, 25, 26})


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level graph has no initializers, made field by field so
    that the original's weights are neither copied nor touched."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    return light


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == 3  # REPEATED
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


@contextlib.contextmanager
def _weights_stripped(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """Yield a copy of ``model`` whose large initializers carry no data (only dims and type)."""
    light = copy_without_initializers(model)
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL and _nbytes(tensor) <= _STRIP_BYTES:
            light.graph.initializer.append(tensor)
        else:
            light.graph.initializer.append(_empty_like(tensor))
    yield light


def _restore_weights(converted: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    full = {t.name: t for t in original.graph.initializer}
    fixed = []
    for tensor in converted.graph.initializer:
        fixed.append(full.get(tensor.name, tensor))
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(fixed)
    return converted


def _empty_like(tensor: TensorProto) -> TensorProto:
    out = TensorProto()
    out.name = tensor.name
    out.data_type = tensor.data_type
    out.dims.extend(tensor.dims)
    n = int(np.prod(tensor.dims)) if tensor.dims else 1
    # shape inference and the checker only need a consistent header; an all-zero raw payload
    # of the right length would cost memory, so a zero-filled *small* tensor stands in when
    # the real one is big (values are never read by inference of our ops).
    if n * _itemsize(tensor.data_type) <= _STRIP_BYTES:
        out.raw_data = bytes(n * _itemsize(tensor.data_type))
    else:
        out.data_location = TensorProto.EXTERNAL
        out.external_data.add(key="location", value="onnxq-stripped.bin")
    return out


def _itemsize(data_type: int) -> int:
    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize)
    except Exception:
        return 4


def _nbytes(tensor: TensorProto) -> int:
    n = int(np.prod(tensor.dims)) if tensor.dims else 1
    return n * _itemsize(tensor.data_type)


def _weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for ``onnx.checker``: big weights become empty tensors of the same type."""
    with _weights_stripped(model) as light:
        for tensor in light.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
                del tensor.dims[:]
                tensor.dims.append(0)
                tensor.raw_data = b""
        return light


def unshare_biases(graph: onnx.GraphProto) -> int:
    """Give every Conv/ConvTranspose/Gemm its own copy of a bias initializer that other nodes
    read too (the torch exporter merges equal initializers); returns the copies made.  Readers
    inside control-flow bodies count too; a copy goes into the reader's own graph.

    A quantized bias is stored at its layer's scale (input scale x weight scale), so one
    tensor cannot serve two layers: onnxruntime would read it at each layer's own scale.  A
    bias whose bytes stay on disk (external data) is left shared."""
    scopes = [graph, *(body.graph for body in all_bodies(graph))]
    inits = {t.name: t for g in scopes for t in g.initializer}
    uses: dict[str, int] = {}
    for g in scopes:
        for node in g.node:
            for name in node.input:
                if name in inits:
                    uses[name] = uses.get(name, 0) + 1
    taken = all_names(graph)
    made = 0
    for g in scopes:
        for node in g.node:
            if (
                node.op_type not in BIAS_READERS
                or node.domain not in DEFAULT_DOMAINS
                or len(node.input) < 3
                or uses.get(node.input[2], 0) < 2
            ):
                continue
            source = inits[node.input[2]]
            if source.data_location == TensorProto.EXTERNAL:
                continue
            uses[node.input[2]] -= 1  # the last reader keeps the original
            name, k = f"{source.name}/{node.name}", 1
            while name in taken:
                name, k = f"{source.name}/{node.name}_{k}", k + 1
            copy = TensorProto()
            copy.CopyFrom(source)
            copy.name = name
            g.initializer.append(copy)
            taken.add(name)
            node.input[2] = name
            made += 1
    return made


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node a unique, deterministic name, and every node and value a name
    unique across the model, control-flow bodies included (reports, annotations and
    statistics refer to nodes and tensors by name alone)."""
    unique_value_names(graph)
    unique_node_names(graph)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
