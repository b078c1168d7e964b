"""The blocks of a model that block reconstruction learns together, found from the graph alone.

A *cut point* is a tensor that, at some point of the graph's topological order, is the only
value still needed by what follows: everything after it depends on the input only through it.
The nodes between two consecutive cut points form a *segment* (a single op in a plain chain; a
whole residual block, its skip and its Add, when the skip keeps two values alive).  A block is
a run of consecutive segments made only of the ops :data:`BLOCK_OPS` that holds at most
``max_layers`` of the layers to learn (:class:`onnxq.recover.adaround.RoundingTarget`); a
segment with more starts a block of its own.  For a MobileNetV2 that gives one block per
inverted-residual block (expand 1x1, ReLU6, depthwise 3x3, ReLU6, project 1x1, the Add when
there is one), without looking at a node's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnxq import ir

BLOCK_OPS = frozenset({"Conv", "Relu", "Clip", "Add", "Identity"})
MAX_LAYERS = 3  # layers to learn per block (one inverted-residual block)


@dataclass(frozen=True)
class Block:
    """Consecutive nodes (by name, in graph order) reading one tensor (``input``) and giving
    one (``output``), and the weights of the layers to learn among them."""

    input: str
    output: str
    nodes: tuple[str, ...]
    weights: tuple[str, ...]


def find_blocks(
    graph: ir.Graph, weights_of: dict[str, str], max_layers: int = MAX_LAYERS
) -> list[Block]:
    """The blocks of ``graph`` in graph order; ``weights_of``: node name -> the weight to learn
    of that layer (nodes not in it are not learned, but may sit inside a block)."""
    blocks: list[Block] = []
    pending: list[tuple[str, list[onnx.NodeProto], str]] = []
    for start, nodes, end in _segments(graph):
        allowed = all(n.op_type in BLOCK_OPS for n in nodes)
        layers = sum(n.name in weights_of for n in nodes)
        held = sum(n.name in weights_of for _, seg, _ in pending for n in seg)
        if pending and (not allowed or held + layers > max_layers):
            blocks.append(_block(pending, weights_of))
            pending = []
        if allowed:
            pending.append((start, nodes, end))
    if pending:
        blocks.append(_block(pending, weights_of))
    return [b for b in blocks if b.weights]


def _block(
    segments: list[tuple[str, list[onnx.NodeProto], str]], weights_of: dict[str, str]
) -> Block:
    nodes = [n for _, seg, _ in segments for n in seg]
    return Block(
        segments[0][0],
        segments[-1][2],
        tuple(n.name for n in nodes),
        tuple(weights_of[n.name] for n in nodes if n.name in weights_of),
    )


def _segments(graph: ir.Graph) -> list[tuple[str, list[onnx.NodeProto], str]]:
    """(cut tensor before, nodes, cut tensor after) for each run of nodes between two
    consecutive cut points, in graph order; Constant nodes are left out."""
    nodes = [n for n in graph.nodes if n.op_type != "Constant"]
    last_use: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            if name and not graph.is_const(name):
                last_use[name] = index
    outputs = {o.name for o in graph.model.graph.output}
    live = {i for i in graph.graph_inputs_set() if i in last_use}
    out: list[tuple[str, list[onnx.NodeProto], str]] = []
    cut = next(iter(live)) if len(live) == 1 else None
    current: list[onnx.NodeProto] = []
    for index, node in enumerate(nodes):
        current.append(node)
        live |= {o for o in node.output if o and (o in last_use or o in outputs)}
        live = {t for t in live if last_use.get(t, -1) > index or t in outputs}
        if len(live) == 1 and len(node.output) == 1 and node.output[0] in live:
            after = node.output[0]
            if cut is not None:
                out.append((cut, current, after))
            cut, current = after, []
    return out


__all__ = ["BLOCK_OPS", "MAX_LAYERS", "Block", "find_blocks"]
