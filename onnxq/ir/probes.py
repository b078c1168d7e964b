"""Probes: values computed inside If/Loop/Scan bodies shown as outputs of the top-level graph,
for the length of a block (calibration observes them there).

Each observed value is threaded out through every enclosing control-flow node:

* ``If``: the branch outputs it and the other branch an empty tensor of the same element type
  (an empty value means "this branch did not run").
* ``Loop``: two carried values collect it over the iterations: its values flattened, and its
  shapes as ``[rank, dims...]`` entries, so every iteration's value comes back whole whatever
  its shape (a value under an If inside the Loop is empty on the iterations the branch is
  not taken).
* ``Scan``: a scan output stacks it per iteration, which needs the same shape on every
  iteration: a value under an If or a Loop inside the Scan body is declined, with the reason.

Every body also outputs a marker, a constant ``[1.0]``, threaded out the same way: how many
values it leaves says how often the body ran (0: an If branch never taken, a Loop that never
iterated).  The model is edited in place (copying it would copy every weight) and
restored when the block ends, even on error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.ir.bodies import Body, all_bodies, all_names, defined_names, opens
from onnxq.ir.probe_plan import Probe, ProbePlan

PROBE_PREFIX = "onnxq_probe/"


@contextlib.contextmanager
def with_probes(model: onnx.ModelProto, tensors: Sequence[str]) -> Iterator[ProbePlan]:
    """``model`` with every value of ``tensors`` that a control-flow body defines, and a run
    marker of every body, threaded out to the top-level graph; ``ProbePlan.outputs``
    are the top-level outputs that carry them, for the caller to expose.  Values the top-level
    graph defines are left to the caller.  Everything is undone when the block ends."""
    plan = ProbePlan()
    if not any(opens(n) for n in model.graph.node):
        yield plan  # no control flow: nothing to thread out
        return
    edits = _Edits(model)
    try:
        _Threader(model, edits, plan).thread(tensors)
        yield plan
    finally:
        edits.restore()


class _Declined(Exception):
    """A value that cannot be threaded out (the message says why)."""


@dataclass(frozen=True)
class _Rep:
    """A value on its way out: its names in the current scope (one, or values and shapes),
    the Scan axes in front, and whether it may be empty (it crossed an If)."""

    names: tuple[str, ...]
    elem: int
    lead: int = 0
    maybe_empty: bool = False


class _Threader:
    """Adds the nodes, outputs and carried values that thread values out (see the module)."""

    def __init__(self, model: onnx.ModelProto, edits: _Edits, plan: ProbePlan) -> None:
        self.model, self.edits, self.plan = model, edits, plan
        self.bodies = all_bodies(model.graph)
        self.owner_of = {name: b for b in self.bodies for name in defined_names(b.graph)}
        self.types = _elem_types(model.graph)
        self.taken = all_names(model.graph)
        self.consts: dict[tuple[str, bytes], str] = {}  # (dtype, bytes) -> top initializer
        self.failed: dict[str, str] = {}  # body key -> why its marker could not get out

    def thread(self, tensors: Sequence[str]) -> None:
        for body in self.bodies:  # outer bodies first
            with contextlib.suppress(_Declined):
                self._mark(body)
        for tensor in sorted(set(tensors)):
            owner = self.owner_of.get(tensor)
            if owner is None:
                continue  # top-level (or unknown): the caller exposes it
            chain = tuple(owner.chain())
            self.plan.chains[tensor] = chain
            try:
                for inner in chain:  # outermost first: a marker's way out is open for the rest
                    self._mark(inner)
                self.plan.probes[tensor] = self._out(owner, tensor)
            except _Declined as why:
                self.plan.declined[tensor] = f"tensor {tensor!r} cannot be calibrated: {why}"

    def _mark(self, body: Body) -> None:
        """Thread out ``body``'s run marker, once."""
        if body.key in self.failed:
            raise _Declined(self.failed[body.key])
        if body.key not in self.plan.markers:
            try:
                self.plan.markers[body.key] = self._out(body, self._marker(body))
            except _Declined as why:
                self.failed[body.key] = str(why)
                raise

    # -- the way out ----------------------------------------------------------------------
    def _out(self, body: Body, tensor: str) -> Probe:
        """Thread ``tensor`` (defined in ``body``) out to the top level."""
        rep = _Rep((tensor,), self.types.get(tensor, TensorProto.FLOAT))
        for where in reversed(body.chain()):
            op = where.owner.op_type
            if op == "If":
                rep = self._through_if(where, rep)
            elif op == "Loop":
                rep = self._through_loop(where, rep)
            else:
                rep = self._through_scan(where, rep)
        self.plan.outputs.extend(
            helper.make_tensor_value_info(n, e, None)
            for n, e in zip(rep.names, (rep.elem, TensorProto.INT64), strict=False)
        )
        return Probe(rep.names, rep.lead)

    def _through_if(self, body: Body, rep: _Rep) -> _Rep:
        """Output ``rep`` from the branch, empty tensors from the other, new If outputs."""
        outs = [self._identity(body.graph, n) for n in rep.names]
        self._add_outputs(body.graph, outs, rep)
        for attr in body.owner.attribute:
            if attr.name != body.attr and attr.type == onnx.AttributeProto.GRAPH:
                empties = [
                    self._constant(attr.g, np.zeros(0, helper.tensor_dtype_to_np_dtype(e)))
                    for e in self._elems(rep)
                ]
                self._add_outputs(attr.g, empties, rep)
        node = self.edits.node(body.owner)
        fresh = [self._fresh("if") for _ in rep.names]
        node.output.extend(fresh)
        return _Rep(tuple(fresh), rep.elem, rep.lead, maybe_empty=True)

    def _through_loop(self, body: Body, rep: _Rep) -> _Rep:
        """Collect ``rep`` over the iterations in two carried values (values, shapes)."""
        g = self.edits.graph(body.graph)
        if len(rep.names) == 1:
            value = rep.names[0]
            flat, rank, dims, entry = (self._fresh(s) for s in ("flat", "rank", "dims", "entry"))
            g.node.extend(
                [
                    helper.make_node("Reshape", [value, self._ints([-1])], [flat]),
                    helper.make_node("Shape", [value], [dims]),
                    helper.make_node("Shape", [dims], [rank]),
                    helper.make_node("Concat", [rank, dims], [entry], axis=0),
                ]
            )
            parts: tuple[str, ...] = (flat, entry)
        else:
            parts = rep.names
        carried = len(g.input) - 2  # Loop body inputs: iteration, condition, carried values
        ins = [self._fresh("acc_in") for _ in parts]
        outs = [self._fresh("acc_out") for _ in parts]
        elems = (rep.elem, TensorProto.INT64)
        vi = helper.make_tensor_value_info
        g.input.extend(vi(n, e, None) for n, e in zip(ins, elems, strict=True))
        g.node.extend(
            helper.make_node("Concat", [a, p], [o], axis=0)
            for a, p, o in zip(ins, parts, outs, strict=True)
        )
        _insert(
            g.output,
            1 + carried,
            [helper.make_tensor_value_info(n, e, None) for n, e in zip(outs, elems, strict=True)],
        )
        node = self.edits.node(body.owner)
        node.input.extend(self._empty(e) for e in elems)
        fresh = [self._fresh("loop") for _ in parts]
        _insert(node.output, carried, fresh)
        return _Rep(tuple(fresh), rep.elem, rep.lead)

    def _through_scan(self, body: Body, rep: _Rep) -> _Rep:
        """Stack ``rep`` per iteration in a new scan output."""
        if len(rep.names) != 1 or rep.maybe_empty:
            raise _Declined(
                f"inside the {body.label} it lies under an If or a Loop, whose values can "
                "change shape (or be missing) from one step to the next, which a Scan output "
                "cannot stack"
            )
        (out,) = [self._identity(body.graph, rep.names[0])]
        self._add_outputs(body.graph, [out], rep)
        node = self.edits.node(body.owner)
        for attr in node.attribute:
            if attr.name in ("scan_output_axes", "scan_output_directions"):
                self.edits.attr(node, attr)
                attr.ints.append(0)
        fresh = self._fresh("scan")
        node.output.append(fresh)
        return _Rep((fresh,), rep.elem, rep.lead + 1)

    # -- pieces ---------------------------------------------------------------------------
    def _marker(self, body: Body) -> str:
        return self._constant(body.graph, np.ones(1, np.float32), "ran")

    def _elems(self, rep: _Rep) -> tuple[int, ...]:
        return (rep.elem,) if len(rep.names) == 1 else (rep.elem, TensorProto.INT64)

    def _add_outputs(self, graph: onnx.GraphProto, names: list[str], rep: _Rep) -> None:
        g = self.edits.graph(graph)
        g.output.extend(
            helper.make_tensor_value_info(n, e, None)
            for n, e in zip(names, self._elems(rep), strict=True)
        )

    def _identity(self, graph: onnx.GraphProto, name: str) -> str:
        out = self._fresh("out")
        self.edits.graph(graph).node.append(helper.make_node("Identity", [name], [out]))
        return out

    def _constant(self, graph: onnx.GraphProto, value: np.ndarray, base: str = "empty") -> str:
        out = self._fresh(base)
        node = helper.make_node("Constant", [], [out], value=numpy_helper.from_array(value))
        self.edits.graph(graph).node.append(node)
        return out

    def _top_constant(self, value: np.ndarray) -> str:
        key = (value.dtype.str + str(value.shape), value.tobytes())
        if key not in self.consts:
            name = self._fresh("const")
            self.edits.graph(self.model.graph).initializer.append(
                numpy_helper.from_array(value, name)
            )
            self.consts[key] = name
        return self.consts[key]

    def _ints(self, values: list[int]) -> str:
        return self._top_constant(np.asarray(values, np.int64))

    def _empty(self, elem: int) -> str:
        return self._top_constant(np.zeros(0, helper.tensor_dtype_to_np_dtype(elem)))

    def _fresh(self, base: str) -> str:
        name, k = f"{PROBE_PREFIX}{base}", 0
        while name in self.taken:
            k += 1
            name = f"{PROBE_PREFIX}{base}_{k}"
        self.taken.add(name)
        return name


def _elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element types of the values in ``graph`` and its bodies, where annotated."""
    out: dict[str, int] = {}
    for g in [graph, *(b.graph for b in all_bodies(graph))]:
        for vi in (*g.input, *g.value_info, *g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                out[vi.name] = int(vi.type.tensor_type.elem_type)
    return out


def _insert(field_: Any, at: int, items: list[Any]) -> None:
    """Insert ``items`` (ValueInfos or names) into a repeated field at position ``at``."""
    kept = list(field_)
    del field_[:]
    field_.extend([*kept[:at], *items, *kept[at:]])


class _Edits:
    """The graphs and nodes a threading touched, as they were, to restore them afterwards."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self._graphs: dict[int, tuple[onnx.GraphProto, int, int, list[bytes], list[bytes]]] = {}
        self._nodes: dict[int, tuple[onnx.NodeProto, list[str], list[str]]] = {}
        self._attrs: dict[int, tuple[onnx.AttributeProto, list[int]]] = {}

    def graph(self, g: onnx.GraphProto) -> onnx.GraphProto:
        """``g``, its state recorded before the first edit."""
        if id(g) not in self._graphs:
            self._graphs[id(g)] = (
                g,
                len(g.node),
                len(g.initializer),
                [vi.SerializeToString() for vi in g.input],
                [vi.SerializeToString() for vi in g.output],
            )
        return g

    def node(self, n: onnx.NodeProto) -> onnx.NodeProto:
        """``n``, its inputs and outputs recorded before the first edit."""
        if id(n) not in self._nodes:
            self._nodes[id(n)] = (n, list(n.input), list(n.output))
        return n

    def attr(self, n: onnx.NodeProto, a: onnx.AttributeProto) -> None:
        """Record the ints of ``n``'s attribute ``a`` before it is edited."""
        self.node(n)
        self._attrs.setdefault(id(a), (a, list(a.ints)))

    def restore(self) -> None:
        """Undo every recorded edit."""
        for a, ints in self._attrs.values():
            del a.ints[:]
            a.ints.extend(ints)
        for n, names_in, names_out in self._nodes.values():
            del n.input[:]
            n.input.extend(names_in)
            del n.output[:]
            n.output.extend(names_out)
        for g, nodes, inits, infos_in, infos_out in self._graphs.values():
            del g.node[nodes:]
            del g.initializer[inits:]
            del g.input[:]
            g.input.extend(onnx.ValueInfoProto.FromString(b) for b in infos_in)
            del g.output[:]
            g.output.extend(onnx.ValueInfoProto.FromString(b) for b in infos_out)
