"""Subgraphs and node order: which names a node reads (its subgraphs' outer-scope reads
included), and the topological sort that loading and :meth:`Graph.commit` share."""

from __future__ import annotations

import heapq

import onnx


def attr_graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The subgraphs an attribute holds (an If's branches, a Loop's body), or none."""
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def node_reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs and what its subgraphs read from outside them."""
    reads = {x for x in node.input if x}
    for attr in node.attribute:
        for sub in attr_graphs(attr):
            reads |= outer_reads(sub)
    return reads


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes."""
    local = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    for node in graph.node:
        local |= {o for o in node.output if o}
    reads: set[str] = set()
    for node in graph.node:
        reads |= {x for x in node_reads(node) if x not in local}
    for out in graph.output:
        if out.name not in local:
            reads.add(out.name)
    return reads


def topological_order(graph: onnx.GraphProto, available: set[str]) -> bool | None:
    """Put ``graph``'s nodes in topological order, keeping the original order where it allows
    (Kahn's algorithm, lowest original index first).  ``available``: the names that need no
    producer (graph inputs, initializers).  Returns whether the order changed, or None (the
    graph left as it was) when some node can never run: a cycle."""
    nodes = list(graph.node)
    needs = [node_reads(n) for n in nodes]  # with the outer-scope names subgraphs read
    produced_by = {out: i for i, n in enumerate(nodes) for out in n.output}
    done = set(available) | {""}
    waiting: dict[int, set[str]] = {}
    readers: dict[str, list[int]] = {}
    ready: list[int] = []
    for i in range(len(nodes)):
        missing = {x for x in needs[i] if x not in done and x in produced_by}
        waiting[i] = missing
        for x in missing:
            readers.setdefault(x, []).append(i)
        if not missing:
            heapq.heappush(ready, i)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for out in nodes[i].output:
            for j in readers.pop(out, []):
                waiting[j].discard(out)
                if not waiting[j]:
                    heapq.heappush(ready, j)
    if len(order) != len(nodes):
        return None
    if order == list(range(len(nodes))):
        return False
    sorted_nodes = [nodes[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
    return True
