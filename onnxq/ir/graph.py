"""The graph index: producers, consumers, constants and types, and the edits the pipeline
needs (add/replace/remove, then ``commit``: topological sort, dead-code removal)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.errors import InternalError
from onnxq.ir import external
from onnxq.ir.bodies import all_names
from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.order import attr_graphs, node_reads, outer_reads, topological_order
from onnxq.ir.shapes import shapes_for_inputs

# ------------------------------------------------------------------------------- the index
_CACHE_LIMIT = 16 * 2**20
# ops whose output is >= 0 whatever their input (NaN aside)
_NONNEGATIVE_OPS = frozenset(
    {"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Softplus", "Abs", "Exp"}
)
# ops whose output is >= 0 when their first input is (they move or pick values, or take
# maxima or means of them)
_SIGN_KEEPING_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Gather",
        "MaxPool",
        "AveragePool",
        "GlobalMaxPool",
        "GlobalAveragePool",
        "DepthToSpace",
        "SpaceToDepth",
        "Tile",
        "Expand",
    }
)


@dataclass(frozen=True)
class ConstInfo:
    """What a constant is without its values: shape and element type."""

    shape: tuple[int, ...]
    dtype: np.dtype  # type: ignore[type-arg]

    @property
    def ndim(self) -> int:
        """The constant's rank."""
        return len(self.shape)


class Graph:
    """Producers, consumers, constants and types of a model's top-level graph (a control-flow
    body's: :class:`~onnxq.ir.body_graph.BodyGraph`, made by :func:`onnxq.ir.scopes`)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.proto = model.graph
        self.root: Graph = self  # the top-level graph's index (a body's outermost scope)
        self._const_cache: dict[str, np.ndarray] = {}
        self.reindex()

    # -- index ---------------------------------------------------------------------------
    def reindex(self) -> None:
        """Rebuild the maps after edits."""
        g = self.proto
        self._probes: list[dict[str, tuple[int | str, ...]]] | None = None  # see same_shape
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
                for sub in attr_graphs(attr):
                    self.subgraph_reads |= outer_reads(sub)
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
            value = external.tensor_array(self.initializers[name])  # lazy: read from disk
        elif name in self.constant_nodes:
            value = constant_node_value(self.constant_nodes[name])
        if value is not None and value.nbytes <= _CACHE_LIMIT:
            self._const_cache[name] = value  # big weights are decoded again when asked for:
        return value  # holding a second copy of a 2 GB model costs more than decoding

    def const_info(self, name: str) -> ConstInfo | None:
        """Shape and element type of a constant tensor (``None`` where :meth:`const_value` is
        None), read from an initializer's header: its data is neither decoded nor read from
        disk."""
        if name in self.graph_inputs_set():
            return None
        init = self.initializers.get(name)
        if init is not None:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
            return ConstInfo(tuple(int(d) for d in init.dims), dtype)
        value = self.const_value(name)
        return None if value is None else ConstInfo(tuple(value.shape), value.dtype)

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

    def same_shape(self, a: str, b: str) -> bool | None:
        """Whether tensors ``a`` and ``b`` always have the same shape: True when their inferred
        shapes are identical, or equal and concrete under two probe sizes of every dynamic
        input dimension (shape inference names each symbolic Conv output afresh, so equal
        shapes of a dynamic-width model often read ``[1, 24, 32, unk__0]`` and ``[..., unk__2]``);
        False when they certainly differ; None when nothing shows either."""
        sa, sb = self.shape(a), self.shape(b)
        if sa is None or sb is None:
            return None
        if sa == sb:  # identical, symbols and unknown dimensions included
            return True
        if len(sa) != len(sb) or any(
            isinstance(x, int) and isinstance(y, int) and x != y
            for x, y in zip(sa, sb, strict=True)
        ):
            return False
        probes = self._shape_probes()
        if not probes:
            return None
        seen = [(p.get(a), p.get(b)) for p in probes]
        if all(
            x is not None and x == y and all(isinstance(d, int) and d > 0 for d in x)
            for x, y in seen
        ):
            return True
        if any(
            x is not None
            and y is not None
            and len(x) == len(y)
            and all(isinstance(d, int) for d in (*x, *y))
            and x != y
            for x, y in seen
        ):
            return False
        return None

    def _shape_probes(self) -> list[dict[str, tuple[int | str, ...]]]:
        """Every tensor's inferred shape with the dynamic input dimensions set to two different
        sizes (multiples of 32; one size per symbol, so dimensions that share a name stay
        equal); [] when the inputs' ranks are unknown or no dimension is dynamic."""
        if self._probes is not None:
            return self._probes
        symbols: dict[str, int] = {}
        shapes: dict[str, list[int | str | None]] = {}
        for name in self.graph_inputs:
            shape = self.shape(name)
            if shape is None:
                self._probes = []
                return self._probes
            dims: list[int | str | None] = []
            for k, d in enumerate(shape):
                key = d if isinstance(d, str) else f"{name}:{k}"
                if not isinstance(d, int):
                    symbols.setdefault(key, len(symbols))
                dims.append(d if isinstance(d, int) else key)
            shapes[name] = dims
        if not symbols:
            self._probes = []
            return self._probes
        self._probes = []
        for base, spread in ((256, 32), (384, 64)):
            concrete = {
                name: tuple(
                    d if isinstance(d, int) else base + spread * symbols[str(d)] for d in dims
                )
                for name, dims in shapes.items()
            }
            self._probes.append(shapes_for_inputs(self.model, concrete))
        return self._probes

    def walk_up(
        self, start: Iterable[str], step: Callable[[str, onnx.NodeProto | None], Iterable[str]]
    ) -> None:
        """Visit every tensor reachable backwards from ``start`` once: ``step(tensor, its
        producer or None)`` returns the tensors to visit next (none: stop there)."""
        seen: set[str] = set()
        todo = list(start)
        while todo:
            tensor = todo.pop()
            if tensor not in seen:
                seen.add(tensor)
                todo.extend(step(tensor, self.producer.get(tensor)))

    def nonnegative(self, name: str) -> bool:
        """True when the ops that produce ``name`` guarantee it is never below 0 (Relu,
        Sigmoid, Clip with a constant min >= 0, ... and shape ops and max/average pools over
        such a tensor).  False whenever that is not certain."""
        unsure: list[str] = []

        def step(tensor: str, node: onnx.NodeProto | None) -> list[str]:
            if node is None or node.domain not in DEFAULT_DOMAINS:
                unsure.append(tensor)
            elif node.op_type in _NONNEGATIVE_OPS:
                pass
            elif node.op_type == "Clip":
                if not self._clip_floor_nonnegative(node):
                    unsure.append(tensor)
            elif node.op_type in _SIGN_KEEPING_OPS or node.op_type == "Concat":
                data = list(node.input if node.op_type == "Concat" else node.input[:1])
                if data and all(data):
                    return data
                unsure.append(tensor)
            else:
                unsure.append(tensor)
            return []

        self.walk_up([name], step)
        return not unsure

    def _clip_floor_nonnegative(self, node: onnx.NodeProto) -> bool:
        low, _ = self.clip_bounds(node)
        return low is not None and low >= 0.0

    def clip_bounds(self, node: onnx.NodeProto) -> tuple[float | None, float | None]:
        """A Clip's constant (min, max); None where it has none (or it is not constant)."""
        attrs = node_attrs(node)
        if "min" in attrs or "max" in attrs:  # opset < 11: attributes
            return (
                float(attrs["min"]) if "min" in attrs else None,
                float(attrs["max"]) if "max" in attrs else None,
            )
        bounds: list[float | None] = []
        for i in (1, 2):  # opset >= 11: optional inputs
            name = node.input[i] if len(node.input) > i else ""
            value = self.const_value(name) if name else None
            bounds.append(
                float(value.reshape(())) if value is not None and value.size == 1 else None
            )
        return bounds[0], bounds[1]

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
            cached |= all_names(self.proto)  # inside control-flow bodies too
            self._taken: set[str] | None = cached
        return cached

    def add_initializer(self, name: str, value: np.ndarray) -> str:
        """Add a constant; returns its name."""
        self.proto.initializer.append(numpy_helper.from_array(np.asarray(value, order="C"), name))
        # index the graph's own copy: the detached original would keep a second copy alive
        self.initializers[name] = self.proto.initializer[-1]
        self._names().add(name)
        return name

    def add_tensor(self, tensor: TensorProto) -> str:
        """Add a ready-made constant (a packed 4-bit tensor numpy cannot hold); returns its
        name."""
        self.proto.initializer.append(tensor)
        self.initializers[tensor.name] = self.proto.initializer[-1]
        self._names().add(tensor.name)
        return tensor.name

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

    def add_node(
        self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any
    ) -> onnx.NodeProto:
        """Append a node (the next :meth:`commit` puts it in topological order)."""
        self.proto.node.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        node = self.proto.node[-1]  # the graph's own copy, not the detached original
        for out in outputs:
            self.producer[out] = node
            self._names().add(out)
        self._names().add(name)
        return node

    def set_input(self, node: onnx.NodeProto, index: int, name: str) -> None:
        """Point input ``index`` of ``node`` at tensor ``name`` (the next index after its
        last input adds it: an optional input it did not have)."""
        if index == len(node.input):
            node.input.append(name)
        else:
            node.input[index] = name

    def set_attr(self, node: onnx.NodeProto, name: str, value: Any) -> None:
        """Set (or replace) attribute ``name`` of ``node``."""
        for i, attr in enumerate(node.attribute):
            if attr.name == name:
                del node.attribute[i]
                break
        node.attribute.append(helper.make_attribute(name, value))

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
        available = set(self.initializers) | set(self.graph_inputs)
        if topological_order(self.proto, available) is None:  # loading checked the input's
            raise InternalError(
                "after onnxq's edits the graph has a cycle (or reads a tensor no node "
                "produces); onnxq needs a DAG"
            )

    def _drop_dead(self) -> None:
        live = set(o.name for o in self.proto.output)
        keep: list[onnx.NodeProto] = []
        for node in reversed(list(self.proto.node)):
            if any(o in live for o in node.output if o):
                keep.append(node)
                live |= node_reads(node)
        keep.reverse()
        del self.proto.node[:]
        self.proto.node.extend(keep)
        # deleted in place: rebuilding the list would copy every kept weight (protobuf copies
        # on extend, and its arena keeps the originals until the model is freed)
        for i in range(len(self.proto.initializer) - 1, -1, -1):
            if self.proto.initializer[i].name not in live:
                del self.proto.initializer[i]
        names = live | {o.name for o in self.proto.output}
        infos = [vi for vi in self.proto.value_info if vi.name in names]
        del self.proto.value_info[:]
        self.proto.value_info.extend(infos)
        inputs = [i for i in self.proto.input if i.name not in self.initializers or i.name in live]
        if len(inputs) != len(self.proto.input):
            del self.proto.input[:]
            self.proto.input.extend(inputs)


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
    return any(attr_graphs(a) for a in node.attribute)


def inner_op_types(node: onnx.NodeProto) -> set[str]:
    """The op types inside ``node``'s subgraphs, at any depth (empty for a plain op)."""
    found: set[str] = set()
    for attr in node.attribute:
        for sub in attr_graphs(attr):
            for inner in sub.node:
                found.add(inner.op_type)
                found |= inner_op_types(inner)
    return found


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
