"""Reading models: safe external data, checks, topological order, unique names and unshared
biases; the opset upgrade (:mod:`onnxq.ir.opset`) and shape inference (:mod:`onnxq.ir.shapes`)
it ends with."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper

from onnxq.errors import ModelLoadError, UnsupportedModelError, first_line
from onnxq.ir import external, inline
from onnxq.ir.bodies import all_bodies, all_names, unique_node_names, unique_value_names
from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.ops import BIAS_READERS
from onnxq.ir.opset import LoadRecord, opset_version, upgrade_opset
from onnxq.ir.order import attr_graphs, topological_order
from onnxq.ir.shapes import infer_shapes
from onnxq.ir.weightless import PACKED_TYPES, itemsize, nbytes, weightless_copy


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
            f"{p}: not a readable ONNX file ({type(exc).__name__}: {first_line(exc)}); "
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
        if tensor.data_type in PACKED_TYPES:  # sub-byte or string payloads: read them in
            with open(path, "rb") as fh:
                fh.seek(item.offset)
                tensor.raw_data = fh.read(item.length)
            continue
        want = nbytes(tensor)
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
        if tensor.data_location != TensorProto.EXTERNAL or tensor.data_type in PACKED_TYPES:
            continue
        path, offset, length = _check_external_location(tensor, base, p)
        if length is None:
            length = path.stat().st_size - offset
        want = nbytes(tensor)
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
            want = n * itemsize(tensor.data_type)
            got = len(tensor.raw_data)
            if got != want and tensor.data_type not in PACKED_TYPES:
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
            and tensor.data_type not in PACKED_TYPES
        ):
            raise ModelLoadError(
                f"{where}: initializer {tensor.name!r} holds {counts[0]} values, its shape "
                f"{list(tensor.dims)} needs {n}; the file is corrupt"
            )


def check_model(model: onnx.ModelProto, where: str = "model") -> None:
    """``onnx.checker`` on the graph, without serialising the weights."""
    try:
        onnx.checker.check_model(weightless_copy(model))
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(
            f"{where}: invalid ONNX graph: {first_line(exc)}"
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
