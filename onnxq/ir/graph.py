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
from onnxq.ir.node_values import constant_node_value
from onnxq.ir.order import attr_graphs, node_reads, outer_reads, topological_order
from onnxq.ir.shape_probes import probe_shapes
from onnxq.ir.sign import clip_bounds, nonnegative

# ------------------------------------------------------------------------------- the index
_CACHE_LIMIT = 16 * 2**20


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
        """Every tensor's shape under two probe sizes of the dynamic input dimensions, computed
        once (:func:`onnxq.ir.shape_probes.probe_shapes`)."""
        if self._probes is None:
            self._probes = probe_shapes(self)
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
        """True when the ops that produce ``name`` guarantee it is never below 0
        (:func:`onnxq.ir.sign.nonnegative`)."""
        return nonnegative(self, name)

    def clip_bounds(self, node: onnx.NodeProto) -> tuple[float | None, float | None]:
        """A Clip's constant (min, max); None where it has none (or it is not constant)."""
        return clip_bounds(self, node)

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
