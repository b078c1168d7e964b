"""Residual sums before a LayerNormalization written as ``Sum``, which onnxruntime keeps apart.

onnxruntime's graph optimizer (SkipLayerNormFusion) turns ``Add(x, skip) -> LayerNormalization``
into its ``SkipLayerNormalization`` kernel when the Add's two inputs have the same 3-D shape.
On the CPU provider that kernel is a plain C++ loop per row (``contrib_ops/cpu/
skip_layer_norm.cc``: a division per element, sums accumulated one by one), while the
``Add`` and ``LayerNormalization`` kernels it replaces are vectorized.  Measured with one thread
on an AMD EPYC Zen 4 (AVX-512 VNNI), onnxruntime 1.32.0, 384 channels: 68 us for the fused
kernel against 14 us for Add + LayerNormalization at 32 tokens, 252 against 40 at 128, 7.7
against 6.6 at 1; the kernel is the same code on every x86 CPU.  ``Sum(x, skip)`` adds the
same two tensors (one addition per element: the same float result), and the fusion matches
``Add`` only, so LayerNormalization keeps its own kernel.

A transformer encoder with the Linear layers' bias folded into onnxruntime's dynamic kernels
(``onnxq.materialize.dynamic``) shows every residual Add + LayerNormalization to the fusion:
all_minilm_l6_v2 spent 17% of its time in 12 SkipLayerNormalization kernels.
"""

from __future__ import annotations

import onnx

from onnxq import ir

# the LayerNormalization ops onnxruntime's fusion takes (ONNX's; its own contrib one)
_NORMS = frozenset({"LayerNormalization"})


def residual_sums(graph: ir.Graph) -> list[str]:
    """Write each Add of two same-shaped activations whose output only a LayerNormalization
    reads (as its input ``X``) as a ``Sum`` of the same inputs under the same node name;
    returns the names of the nodes rewritten (edits ``graph``, re-indexed)."""
    found = [node for node in graph.nodes if _fusable_add(graph, node)]
    if not found:
        return []
    rewritten = [(n.name, list(n.input), list(n.output)) for n in found]
    graph.remove_nodes(found)
    for name, inputs, outputs in rewritten:
        graph.add_node("Sum", inputs, outputs, name)
    graph.reindex()
    return [name for name, _, _ in rewritten]


def _fusable_add(graph: ir.Graph, node: onnx.NodeProto) -> bool:
    """An Add onnxruntime's SkipLayerNormFusion would fold into the LayerNormalization after it:
    two non-constant inputs of the same shape, one reader, a LayerNormalization's input 0."""
    if node.op_type != "Add" or node.domain not in ir.DEFAULT_DOMAINS or len(node.input) != 2:
        return False
    a, b = node.input
    out = node.output[0]
    if graph.is_const(a) or graph.is_const(b) or out in graph.graph_outputs:
        return False
    if out in graph.subgraph_reads:  # an If/Loop/Scan body reads it too
        return False
    readers = graph.consumers.get(out, [])
    if len(readers) != 1:
        return False
    reader, index = readers[0]
    if reader.op_type not in _NORMS or reader.domain not in ir.DEFAULT_DOMAINS or index != 0:
        return False
    return graph.same_shape(a, b) is True
