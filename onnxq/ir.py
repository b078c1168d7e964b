"""Model I/O and graph plumbing: the only module that edits ONNX protos.

``load_model`` reads a model safely (external data confined to the model's folder), upgrades an
opset too old for per-axis Q/DQ and runs shape inference.  :class:`Graph` is an index over a
``GraphProto`` (producers, consumers, constants, types) with the few edits the pipeline needs;
after a batch of edits, :meth:`Graph.commit` re-sorts the nodes topologically and drops what no
longer feeds an output.  ``save_model`` writes atomically.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.errors import ModelLoadError, OutputError, UnsupportedModelError

# Protobuf cannot serialize a message of 2 GiB or more; stay well below it.
PROTO_LIMIT = 2**31 - 2**26
DEFAULT_DOMAINS = ("", "ai.onnx")

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                         TensorProto.DOUBLE})


# ------------------------------------------------------------------------------- loading
def load_model(path: str | os.PathLike[str], min_opset: int = 13) -> onnx.ModelProto:
    """Read, check, upgrade (to ``min_opset``) and shape-infer a model file.

    External data must lie inside the model's folder; anything else (``..``, absolute paths,
    symlinks that leave the folder) is refused before a byte of it is read.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
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
    try:
        onnx.load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{p}: cannot read external data: {exc}") from None
    check_model(model, where=str(p))
    model = upgrade_opset(model, min_opset, where=str(p))
    name_nodes(model.graph)
    return infer_shapes(model)


def check_model(model: onnx.ModelProto, where: str = "model") -> None:
    """``onnx.checker`` on the graph, without serialising the weights."""
    try:
        onnx.checker.check_model(_weightless_copy(model))
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"{where}: invalid ONNX graph: {_first_line(exc)}") from None


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
            for sub in _attr_graphs(attr):
                yield from _all_tensors(sub)


def _attr_graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _check_external_location(tensor: TensorProto, base: Path, model_path: Path) -> None:
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    where = f"{model_path}: initializer {tensor.name!r}"
    if not location:
        raise ModelLoadError(f"{where}: external data without a location")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise ModelLoadError(
            f"{where}: external data location {location!r} is an absolute path; refused for "
            "safety (it must be a file inside the model's folder)"
        )
    resolved = (base / location).resolve()
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
    offset = int(info.get("offset", 0) or 0)
    length = int(info.get("length", 0) or 0)
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelLoadError(
            f"{where}: external data range {offset}+{length} is past the end of {location!r} "
            f"({size} bytes); the data file is truncated or belongs to another model"
        )


def upgrade_opset(model: onnx.ModelProto, min_opset: int, where: str = "model") -> onnx.ModelProto:
    """Convert the default-domain opset up to ``min_opset`` (per-axis Q/DQ needs 13)."""
    current = opset_version(model)
    if current >= min_opset:
        return model
    from onnx import version_converter

    try:
        with _weights_stripped(model) as light:
            converted = version_converter.convert_version(light, min_opset)
            restored = _restore_weights(converted, model)
    except Exception as exc:
        raise UnsupportedModelError(
            f"{where}: opset {current} is below {min_opset}, which per-channel Q/DQ needs, and "
            f"the upgrade failed ({_first_line(exc)}); re-export the model with opset >= "
            f"{min_opset}"
        ) from None
    return restored


def opset_version(model: onnx.ModelProto) -> int:
    """The default-domain opset of a model."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 1


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that never serialises large weights (works past 2 GB)."""
    with _weights_stripped(model) as light:
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except Exception:  # inference is a help, not a requirement
            return model
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for dst, src in zip(model.graph.output, inferred.graph.output, strict=True):
        dst.CopyFrom(src)
    return model


_STRIP_BYTES = 1024


@contextlib.contextmanager
def _weights_stripped(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """Yield a copy of ``model`` whose large initializers carry no data (only dims and type)."""
    graph = model.graph
    kept = list(graph.initializer)
    del graph.initializer[:]
    try:
        light = onnx.ModelProto()
        light.CopyFrom(model)
    finally:
        graph.initializer.extend(kept)
    for tensor in kept:
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


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node a unique, deterministic name (reports refer to nodes by name)."""
    taken = {n.name for n in graph.node if n.name}
    for index, node in enumerate(graph.node):
        if not node.name:
            base = f"{node.op_type}_{index}"
            name = base
            k = 1
            while name in taken:
                name = f"{base}_{k}"
                k += 1
            node.name = name
            taken.add(name)
    seen: set[str] = set()
    for node in graph.node:  # duplicate names make reports ambiguous
        if node.name in seen:
            k = 1
            while f"{node.name}_{k}" in taken:
                k += 1
            node.name = f"{node.name}_{k}"
            taken.add(node.name)
        seen.add(node.name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ------------------------------------------------------------------------------- the index
class Graph:
    """Producers, consumers, constants and types of a model's top-level graph."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.proto = model.graph
        self._const_cache: dict[str, np.ndarray] = {}
        self.reindex()

    # -- index ---------------------------------------------------------------------------
    def reindex(self) -> None:
        """Rebuild the maps after edits."""
        g = self.proto
        self.initializers: dict[str, TensorProto] = {t.name: t for t in g.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        self.constant_nodes: dict[str, onnx.NodeProto] = {}
        for node in g.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for i, name in enumerate(node.input):
                if name:
                    self.consumers.setdefault(name, []).append((node, i))
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
                self.constant_nodes[node.output[0]] = node
        self.subgraph_reads: set[str] = set()
        for node in g.node:
            for attr in node.attribute:
                for sub in _attr_graphs(attr):
                    self.subgraph_reads |= _outer_reads(sub)
        self.graph_inputs = [i.name for i in g.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in g.output]
        self.types: dict[str, onnx.TypeProto] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            self.types[vi.name] = vi.type
        self._const_cache = {}

    @property
    def nodes(self) -> list[onnx.NodeProto]:
        """The nodes in their current order."""
        return list(self.proto.node)

    def node_by_name(self, name: str) -> onnx.NodeProto | None:
        """The node called ``name``, if any."""
        for node in self.proto.node:
            if node.name == name:
                return node
        return None

    # -- constants -----------------------------------------------------------------------
    def is_const(self, name: str) -> bool:
        """True for initializers and outputs of Constant nodes (not graph inputs)."""
        if name in self.graph_inputs_set():
            return False
        return name in self.initializers or name in self.constant_nodes

    def graph_inputs_set(self) -> set[str]:
        return set(self.graph_inputs)

    def const_value(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor, or ``None`` if ``name`` is not constant."""
        if name in self._const_cache:
            return self._const_cache[name]
        value: np.ndarray | None = None
        if name in self.graph_inputs_set():
            return None
        if name in self.initializers:
            value = numpy_helper.to_array(self.initializers[name])
        elif name in self.constant_nodes:
            value = constant_node_value(self.constant_nodes[name])
        if value is not None:
            self._const_cache[name] = value
        return value

    # -- types ---------------------------------------------------------------------------
    def elem_type(self, name: str) -> int | None:
        """The element type of a tensor (from initializers or shape inference)."""
        if name in self.initializers:
            return int(self.initializers[name].data_type)
        if name in self.constant_nodes:
            value = self.const_value(name)
            return helper.np_dtype_to_tensor_dtype(value.dtype) if value is not None else None
        t = self.types.get(name)
        if t is not None and t.HasField("tensor_type") and t.tensor_type.elem_type:
            return int(t.tensor_type.elem_type)
        return None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        """The inferred shape: ints for static dims, strings for symbolic, None for unknown."""
        if name in self.initializers:
            return tuple(int(d) for d in self.initializers[name].dims)
        value = self.const_value(name) if name in self.constant_nodes else None
        if value is not None:
            return tuple(value.shape)
        t = self.types.get(name)
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        dims: list[int | str | None] = []
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        return tuple(dims)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """A ValueInfo for ``name`` (type from inference; float when unknown)."""
        vi = onnx.ValueInfoProto()
        vi.name = name
        t = self.types.get(name)
        if t is not None:
            vi.type.CopyFrom(t)
        else:
            vi.type.tensor_type.elem_type = self.elem_type(name) or TensorProto.FLOAT
        return vi

    # -- edits ---------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """A tensor/node name not used anywhere in the graph yet."""
        taken = self._names()
        name, k = base, 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    def _names(self) -> set[str]:
        cached = getattr(self, "_taken", None)
        if cached is None:
            cached = set(self.initializers) | set(self.producer) | set(self.graph_inputs)
            cached |= {n.name for n in self.proto.node} | set(self.subgraph_reads)
            cached |= {vi.name for vi in self.proto.value_info}
            self._taken: set[str] | None = cached
        return cached

    def add_initializer(self, name: str, value: np.ndarray) -> str:
        """Add a constant; returns its name."""
        tensor = numpy_helper.from_array(np.asarray(value, order="C"), name)
        self.proto.initializer.append(tensor)
        self.initializers[name] = tensor
        self._names().add(name)
        return name

    def set_initializer(self, name: str, value: np.ndarray) -> None:
        """Replace the value of an existing initializer (or add it)."""
        tensor = numpy_helper.from_array(np.asarray(value, order="C"), name)
        for i, t in enumerate(self.proto.initializer):
            if t.name == name:
                self.proto.initializer[i].CopyFrom(tensor)
                self.initializers[name] = self.proto.initializer[i]
                self._const_cache.pop(name, None)
                return
        self.add_initializer(name, value)

    def add_node(self, op_type: str, inputs: list[str], outputs: list[str], name: str,
                 **attrs: Any) -> onnx.NodeProto:
        """Append a node (the next :meth:`commit` puts it in topological order)."""
        self.proto.node.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        node = self.proto.node[-1]  # the graph's own copy, not the detached original
        for out in outputs:
            self.producer[out] = node
            self._names().add(out)
        self._names().add(name)
        return node

    def set_input(self, node: onnx.NodeProto, index: int, name: str) -> None:
        """Point input ``index`` of ``node`` at tensor ``name``."""
        node.input[index] = name

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of ``old`` (nodes and graph outputs) read ``new``."""
        for node in self.proto.node:
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new

    def remove_nodes(self, nodes: list[onnx.NodeProto]) -> None:
        """Drop nodes (matched by name, which :func:`name_nodes` made unique), then re-index.

        Deleting in place keeps every other node object valid; rebuilding the repeated field
        would silently detach the references held in the index.
        """
        if not nodes:
            return
        doomed = {n.name for n in nodes}
        for i in range(len(self.proto.node) - 1, -1, -1):
            if self.proto.node[i].name in doomed:
                del self.proto.node[i]
        self.reindex()

    def commit(self) -> None:
        """Topologically sort, drop dead nodes and unused initializers, re-index."""
        self._toposort()
        self._drop_dead()
        self.reindex()
        self._taken = None

    def _toposort(self) -> None:
        nodes = list(self.proto.node)
        available = set(self.initializers) | set(self.graph_inputs) | {""}
        # outer-scope names read by subgraphs must be produced before their node
        pending = list(range(len(nodes)))
        needs = [_node_reads(n) for n in nodes]
        produced_by = {}
        for i, n in enumerate(nodes):
            for out in n.output:
                produced_by[out] = i
        order: list[int] = []
        done = set(available)
        # Kahn with a stable priority: the lowest original index that is ready goes first.
        import heapq

        waiting: dict[int, set[str]] = {}
        readers: dict[str, list[int]] = {}
        ready: list[int] = []
        for i in pending:
            missing = {x for x in needs[i] if x not in done and x in produced_by}
            waiting[i] = missing
            for x in missing:
                readers.setdefault(x, []).append(i)
            if not missing:
                heapq.heappush(ready, i)
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for out in nodes[i].output:
                for j in readers.pop(out, []):
                    waiting[j].discard(out)
                    if not waiting[j]:
                        heapq.heappush(ready, j)
        if len(order) != len(nodes):
            raise UnsupportedModelError(
                "the graph has a cycle (or reads a tensor no node produces); onnxq needs a DAG"
            )
        sorted_nodes = [nodes[i] for i in order]
        del self.proto.node[:]
        self.proto.node.extend(sorted_nodes)

    def _drop_dead(self) -> None:
        live = set(o.name for o in self.proto.output)
        keep: list[onnx.NodeProto] = []
        for node in reversed(list(self.proto.node)):
            if any(o in live for o in node.output if o):
                keep.append(node)
                live |= _node_reads(node)
        keep.reverse()
        del self.proto.node[:]
        self.proto.node.extend(keep)
        used = [t for t in self.proto.initializer if t.name in live]
        if len(used) != len(self.proto.initializer):
            del self.proto.initializer[:]
            self.proto.initializer.extend(used)
        names = live | {o.name for o in self.proto.output}
        infos = [vi for vi in self.proto.value_info if vi.name in names]
        del self.proto.value_info[:]
        self.proto.value_info.extend(infos)
        inputs = [i for i in self.proto.input if i.name not in self.initializers or i.name in live]
        if len(inputs) != len(self.proto.input):
            del self.proto.input[:]
            self.proto.input.extend(inputs)


def _node_reads(node: onnx.NodeProto) -> set[str]:
    reads = {x for x in node.input if x}
    for attr in node.attribute:
        for sub in _attr_graphs(attr):
            reads |= _outer_reads(sub)
    return reads


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes."""
    local = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    for node in graph.node:
        local |= {o for o in node.output if o}
    reads: set[str] = set()
    for node in graph.node:
        reads |= {x for x in _node_reads(node) if x not in local}
    for out in graph.output:
        if out.name not in local:
            reads.add(out.name)
    return reads


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, or ``None`` for a sparse one."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain Python values (subgraphs left out)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        out[attr.name] = helper.get_attribute_value(attr)
    return out


def has_subgraph(node: onnx.NodeProto) -> bool:
    """True for If/Loop/Scan and any node with a graph attribute."""
    return any(_attr_graphs(a) for a in node.attribute)


def set_opset(model: onnx.ModelProto, version: int) -> None:
    """Raise the default-domain opset import to ``version`` (never lowers)."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            imp.version = max(int(imp.version), version)
            return
    model.opset_import.add(domain="", version=version)


# ------------------------------------------------------------------------------- saving
def model_nbytes(model: onnx.ModelProto) -> int:
    """Approximate serialized size: the weights dominate."""
    return sum(_nbytes(t) for t in model.graph.initializer) + 1_000_000


def serialize(model: onnx.ModelProto) -> bytes:
    """Deterministic serialization for models under the protobuf limit."""
    return model.SerializeToString(deterministic=True)


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str],
               external_data: bool | None = None) -> list[Path]:
    """Write ``model`` atomically; returns the files written.

    ``external_data=None`` stores weights in a ``<name>.data`` file beside the model only when
    the model would pass protobuf's 2 GB limit.  Files appear under their final names only when
    complete (written to a temporary file in the same folder, then renamed).
    """
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"output folder does not exist: {folder}")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"output folder is not writable: {folder}")
    if external_data is None:
        external_data = model_nbytes(model) >= PROTO_LIMIT
    if not external_data:
        atomic_write_bytes(out, serialize(model))
        return [out]
    return _save_external(model, out)


def _save_external(model: onnx.ModelProto, out: Path) -> list[Path]:
    data_name = out.name + ".data"
    data_path = out.parent / data_name
    moved: list[tuple[TensorProto, bytes]] = []
    with _temp_beside(data_path) as tmp_data:
        offset = 0
        with open(tmp_data, "wb") as fh:
            for tensor in model.graph.initializer:
                if _nbytes(tensor) < 1024 or tensor.data_location == TensorProto.EXTERNAL:
                    continue
                raw = numpy_helper.to_array(tensor).tobytes() if not tensor.raw_data \
                    else tensor.raw_data
                pad = (-offset) % 4096
                fh.write(b"\0" * pad)
                offset += pad
                fh.write(raw)
                moved.append((tensor, raw))
                _mark_external(tensor, data_name, offset, len(raw))
                offset += len(raw)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            body = serialize(model)
        finally:
            for tensor, raw in moved:  # give the in-memory model its weights back
                del tensor.external_data[:]
                tensor.ClearField("data_location")
                tensor.raw_data = raw
        with _temp_beside(out) as tmp_model:
            tmp_model.write_bytes(body)
            os.replace(tmp_data, data_path)
            os.replace(tmp_model, out)
    return [out, data_path]


def _mark_external(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="offset", value=str(offset))
    tensor.external_data.add(key="length", value=str(length))


@contextlib.contextmanager
def _temp_beside(target: Path) -> Iterator[Path]:
    """A temporary path in ``target``'s folder, removed unless renamed away."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename."""
    target = Path(path)
    try:
        with _temp_beside(target) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
    except PermissionError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror}") from None
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None


def session_bytes_or_path(model: onnx.ModelProto, workdir: Path) -> bytes | str:
    """What onnxruntime's InferenceSession should load: bytes, or a file for huge models."""
    if model_nbytes(model) < PROTO_LIMIT:
        return serialize(model)
    path = workdir / "model.onnx"
    save_model(model, path, external_data=True)
    return str(path)


def make_tensor_value_info(name: str, elem_type: int) -> onnx.ValueInfoProto:
    """A ValueInfo with an element type and unknown shape."""
    return helper.make_tensor_value_info(name, elem_type, None)
