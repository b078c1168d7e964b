"""A model cut in two at one tensor: the part after it as a model of its own, whose inputs are
that tensor and everything else the part reads from before the cut (a search that tries
several values of one tensor then runs the part before the cut once per batch, and only the
part after it once per value)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from onnxq.ir.order import node_reads


@dataclass(frozen=True)
class Cut:
    """The part of a model after the node that produces ``tensor``: ``suffix`` (a model),
    ``boundary`` (its inputs, ``tensor`` among them when it reads it: the tensors produced
    before the cut or given as graph inputs, in graph order) and ``outputs`` (the graph
    outputs it computes; those produced before the cut are left out)."""

    tensor: str
    suffix: onnx.ModelProto
    boundary: tuple[str, ...]
    outputs: tuple[str, ...]


def cut_after(
    model: onnx.ModelProto, tensor: str, types: Callable[[str], onnx.ValueInfoProto]
) -> Cut:
    """The :class:`Cut` of ``model`` (top graph in topological order; not edited) after the
    producer of ``tensor``.  Nodes that read only constants (a weight's DequantizeLinear)
    stay in the suffix wherever they are; ``types``: the value info of a boundary tensor."""
    graph = model.graph
    nodes = list(graph.node)
    where = next(i for i, n in enumerate(nodes) if tensor in n.output)
    constant = {t.name for t in graph.initializer}
    for node in nodes:
        if node.op_type == "Constant" or (node.input and node_reads(node) <= constant):
            constant |= {o for o in node.output if o}
    produced_after = {o for n in nodes[where + 1 :] for o in n.output if o}
    wanted = [o.name for o in graph.output if o.name in produced_after]
    keep = _needed(nodes, wanted, constant, where)
    suffix_nodes = [n for i, n in enumerate(nodes) if i in keep]
    made = {o for n in suffix_nodes for o in n.output if o}
    boundary: list[str] = []
    for node in suffix_nodes:
        for name in sorted(node_reads(node)):
            if name not in made and name not in constant and name not in boundary:
                boundary.append(name)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(suffix_nodes)
    del out.graph.input[:]
    out.graph.input.extend(types(name) for name in boundary)
    outputs = [o for o in graph.output if o.name in wanted]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    used = set().union(*(node_reads(n) for n in suffix_nodes)) if suffix_nodes else set()
    initializers = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(initializers)
    return Cut(tensor, out, tuple(boundary), tuple(wanted))


def _needed(
    nodes: list[onnx.NodeProto], wanted: list[str], constant: set[str], where: int
) -> set[int]:
    """Indices of the nodes after ``where`` that ``wanted`` depends on, and of the constant
    nodes (before it too) that those read."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    keep: set[int] = set()
    todo = [producer[w] for w in wanted if w in producer]
    while todo:
        i = todo.pop()
        if i in keep or (i <= where and not (set(nodes[i].output) & constant)):
            continue
        keep.add(i)
        todo.extend(producer[x] for x in node_reads(nodes[i]) if x in producer)
    return keep
