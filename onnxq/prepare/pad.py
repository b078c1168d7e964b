"""Zero ``Pad`` nodes in front of convolutions: dropped when they pad nothing, else moved into
the Conv's own ``pads``.

TensorFlow-style "same" padding exports as an explicit ``Pad`` before each Conv (Hugging Face's
MobileNet and EfficientNet ports, tf2onnx graphs), often with all-zero pads in front of 1x1
convs.  In a float model onnxruntime folds them into the Conv; between Q/DQ pairs they stay
separate kernels (eight of them took 2.3 ms in a MobileNetV2 that ran 0.88x float speed).
A Conv pads with zeros itself, so ``Conv(Pad(x, p, 0))`` is ``Conv(x)`` with its pads
increased by ``p``: the same products summed in the same order, bit-exact.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir


def fold_pad(graph: ir.Graph) -> bool:
    """Remove no-op constant Pads; fold a zero, spatial-only, non-negative Pad whose every
    reader is a Conv (reading it as data, with explicit pads) into those Convs."""
    doomed = []
    for node in graph.nodes:
        pads = _zero_pads(graph, node)
        if pads is None:
            continue
        out, src = node.output[0], node.input[0]
        if out in graph.graph_outputs or out in graph.subgraph_reads:
            continue
        if not any(pads):
            graph.replace_uses(out, src)
            doomed.append(node)
            continue
        readers = graph.consumers.get(out, [])
        rank = len(pads) // 2
        if (
            rank < 3
            or any(pads[i] or pads[rank + i] for i in (0, 1))
            or not readers
            or not all(_conv_reads_data(graph, r, i, rank) for r, i in readers)
        ):
            continue
        begins, ends = pads[2:rank], pads[rank + 2 :]
        for conv, _ in readers:
            old = list(ir.node_attrs(conv).get("pads", [0] * (2 * (rank - 2))))
            spatial = rank - 2
            new = [old[k] + begins[k] for k in range(spatial)] + [
                old[spatial + k] + ends[k] for k in range(spatial)
            ]
            graph.set_attr(conv, "pads", new)
            graph.set_input(conv, 0, src)
        doomed.append(node)
    graph.remove_nodes(doomed)
    return bool(doomed)


def _zero_pads(graph: ir.Graph, node: onnx.NodeProto) -> list[int] | None:
    """The pads (begins then ends, every axis) of a constant-mode Pad that pads with 0 and
    never crops; None for any other node."""
    if node.op_type != "Pad" or node.domain not in ir.DEFAULT_DOMAINS:
        return None
    attrs = ir.node_attrs(node)
    mode = attrs.get("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return None
    if "pads" in attrs:  # opset < 11: attributes
        pads, value = list(attrs["pads"]), float(attrs.get("value", 0.0))
    else:
        if len(node.input) < 2 or not node.input[1]:
            return None
        raw = graph.const_value(node.input[1])
        if raw is None:
            return None
        pads = [int(v) for v in np.asarray(raw).reshape(-1)]
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            fill = graph.const_value(node.input[2])
            if fill is None or fill.size != 1:
                return None
            value = float(np.asarray(fill).reshape(-1)[0])
        if len(node.input) > 3 and node.input[3]:  # opset 18 axes: pads for those axes only
            full = _full_pads(graph, node, pads)
            if full is None:
                return None
            pads = full
    if value != 0.0 or any(p < 0 for p in pads) or len(pads) % 2:
        return None
    return pads


def _full_pads(graph: ir.Graph, node: onnx.NodeProto, pads: list[int]) -> list[int] | None:
    axes = graph.const_value(node.input[3])
    shape = graph.shape(node.input[0])
    if axes is None or shape is None:
        return None
    rank, listed = len(shape), [int(a) for a in np.asarray(axes).reshape(-1)]
    listed = [a + rank if a < 0 else a for a in listed]
    if len(pads) != 2 * len(listed) or len(set(listed)) != len(listed):
        return None
    full = [0] * (2 * rank)
    for k, axis in enumerate(listed):
        full[axis], full[rank + axis] = pads[k], pads[len(listed) + k]
    return full


def _conv_reads_data(graph: ir.Graph, node: onnx.NodeProto, index: int, rank: int) -> bool:
    """True for a Conv reading the tensor as its data input, with explicit pads (auto_pad
    NOTSET) over ``rank - 2`` spatial axes."""
    if node.op_type != "Conv" or node.domain not in ir.DEFAULT_DOMAINS or index != 0:
        return False
    attrs = ir.node_attrs(node)
    auto = attrs.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) != "NOTSET":
        return False
    weight = graph.shape(node.input[1]) if len(node.input) > 1 else None
    return (
        weight is not None
        and len(weight) == rank
        and len(attrs.get("pads", [])) in (0, 2 * (rank - 2))
    )
