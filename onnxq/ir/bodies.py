"""Control-flow bodies as protos: which graphs sit inside ``If``, ``Loop`` and ``Scan`` nodes
(:class:`Body`), the names they define, and the names of the whole model.

Only the bodies of the default domain's ``If``, ``Loop`` and ``Scan`` are opened (placed,
calibrated, quantized); other graph attributes (a custom op's, ``SequenceMap``'s) are left as
they are.  :class:`~onnxq.ir.body_graph.BodyGraph` indexes one body like the top-level graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx

from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.order import attr_graphs

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def opens(node: onnx.NodeProto) -> bool:
    """Whether onnxq places Q/DQ inside ``node``'s bodies (If, Loop, Scan)."""
    return node.op_type in CONTROL_FLOW_OPS and node.domain in DEFAULT_DOMAINS


@dataclass(frozen=True, eq=False)
class Body:
    """One body: attribute ``attr`` of ``owner`` (an If, Loop or Scan), which sits in
    ``parent`` (None: the top-level graph)."""

    graph: onnx.GraphProto
    owner: onnx.NodeProto
    attr: str
    parent: Body | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """``owner/attr``: unique in the model (node names are)."""
        return f"{self.owner.name}/{self.attr}"

    @property
    def label(self) -> str:
        """How a message names it: ``else_branch of If 'If_0'``."""
        return f"{self.attr} of {self.owner.op_type} {self.owner.name!r}"

    def chain(self) -> list[Body]:
        """This body and the bodies around it, outermost first."""
        out: list[Body] = []
        body: Body | None = self
        while body is not None:
            out.append(body)
            body = body.parent
        return out[::-1]


def child_bodies(graph: onnx.GraphProto, parent: Body | None = None) -> list[Body]:
    """The bodies of ``graph``'s own control-flow nodes, in node and attribute order."""
    return [
        Body(sub, node, attr.name, parent)
        for node in graph.node
        if opens(node)
        for attr in node.attribute
        for sub in attr_graphs(attr)
    ]


def all_bodies(graph: onnx.GraphProto, parent: Body | None = None) -> list[Body]:
    """Every body inside ``graph``, at any depth, depth first (a body before those inside it)."""
    out = []
    for body in child_bodies(graph, parent):
        out.append(body)
        out.extend(all_bodies(body.graph, body))
    return out


def every_graph(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph attribute inside it, at any depth (all node types)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in attr_graphs(attr):
                yield from every_graph(sub)


def every_node(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The nodes of ``graph`` and of every graph attribute inside it, at any depth."""
    for g in every_graph(graph):
        yield from g.node


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """The values ``graph`` itself defines: inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    return names | {o for n in graph.node for o in n.output if o}


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name in ``graph`` and its subgraphs (for fresh names)."""
    names: set[str] = set()
    for g in every_graph(graph):
        names |= defined_names(g) | {n.name for n in g.node} | {o.name for o in g.output}
        names |= {vi.name for vi in g.value_info}
    return names


def unique_value_names(graph: onnx.GraphProto) -> int:
    """Rename the values a body defines under a name that another scope defines too (sibling
    branches may each define ``x``; a body may shadow an outer name), so that every value name
    is unique across the model; returns how many were renamed.  The top-level graph keeps its
    names; a renamed value's readers in its body and in the bodies inside it follow."""
    seen = defined_names(graph)
    taken = all_names(graph)
    renamed = 0
    for body in all_bodies(graph):
        for name in sorted(defined_names(body.graph)):
            if name not in seen:
                seen.add(name)
                continue
            fresh, k = f"{name}__{body.owner.name}", 1
            while fresh in taken:
                fresh, k = f"{name}__{body.owner.name}_{k}", k + 1
            taken.add(fresh)
            seen.add(fresh)
            _rename_in(body.graph, name, fresh, defining=True)
            renamed += 1
    return renamed


def _rename_in(graph: onnx.GraphProto, old: str, new: str, defining: bool) -> None:
    """Rename value ``old`` in ``graph`` (where it is defined, ``defining``, or read from an
    enclosing scope) and in the subgraphs that read it without defining it."""
    if not defining and old in defined_names(graph):
        return  # shadowed here: this graph's own ``old`` is another value
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.name == old:
            vi.name = new
    for tensor in graph.initializer:
        if tensor.name == old:
            tensor.name = new
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        for attr in node.attribute:
            for sub in attr_graphs(attr):
                _rename_in(sub, old, new, defining=False)


def unique_node_names(graph: onnx.GraphProto) -> None:
    """Give every node of the model, in every graph, a unique deterministic name (reports and
    annotations refer to nodes by name alone)."""
    graphs = list(every_graph(graph))
    taken = {n.name for g in graphs for n in g.node if n.name}
    for g in graphs:
        for index, node in enumerate(g.node):
            if not node.name:
                base = f"{node.op_type}_{index}"
                name, k = base, 1
                while name in taken:
                    name, k = f"{base}_{k}", k + 1
                node.name = name
                taken.add(name)
    seen: set[str] = set()
    for g in graphs:
        for node in g.node:  # duplicate names make reports ambiguous
            if node.name in seen:
                k = 1
                while f"{node.name}_{k}" in taken:
                    k += 1
                node.name = f"{node.name}_{k}"
                taken.add(node.name)
            seen.add(node.name)
