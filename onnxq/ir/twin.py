"""The comparison model of ``onnxq analyze``: a float model and two copies of its Q/DQ version
in one graph, so that one onnxruntime run gives, for every tensor, the float value, the value
with everything before it quantized (the *accumulated* copy) and the value with only the ops
since the last quantization boundary quantized (the *local* copy).

The local copy is the Q/DQ model whose activation QuantizeLinear nodes read the float copy's
tensors: every quantized op then sees the float model's inputs, quantized once, so its output
differs from the float one by its own quantization only (inputs and weights).  The tensors of
the quantized copies get a suffix (:data:`ACCUMULATED`, :data:`LOCAL`); their initializers are
shared by both copies (:data:`QUANT_INIT` where a name is also the float model's).  Names read
inside control-flow bodies from the enclosing graph are renamed there too; quantization inside
bodies stays accumulated in the local copy (only top-level QuantizeLinear nodes are rewired).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import onnx

from onnxq.ir.order import attr_graphs, outer_reads

ACCUMULATED = "@onnxq_acc"
LOCAL = "@onnxq_local"
QUANT_INIT = "@onnxq_q"


@dataclass(frozen=True)
class Twin:
    """The comparison model and where its copies keep each float tensor.

    ``fake_quantized`` maps a tensor of the local copy that holds an activation after its
    Q/DQ to the float tensor it quantizes (the input error of the ops that read it)."""

    model: onnx.ModelProto
    fake_quantized: dict[str, str]

    @staticmethod
    def accumulated(name: str) -> str:
        """The accumulated copy's name of float tensor ``name``."""
        return name + ACCUMULATED

    @staticmethod
    def local(name: str) -> str:
        """The local copy's name of float tensor ``name``."""
        return name + LOCAL


def twin_model(float_model: onnx.ModelProto, quant_model: onnx.ModelProto) -> Twin:
    """The float model with the accumulated and local copies of ``quant_model`` beside it
    (both models read the same graph inputs and have the same default-domain opset)."""
    fgraph, qgraph = float_model.graph, quant_model.graph
    inputs = {i.name for i in fgraph.input}
    float_names = _defined(fgraph)
    float_inits = {t.name for t in fgraph.initializer} - inputs
    init_names = {
        t.name: (t.name + QUANT_INIT if t.name in float_names else t.name)
        for t in qgraph.initializer
        if t.name not in inputs
    }
    out = onnx.ModelProto()
    out.CopyFrom(float_model)
    g = out.graph
    del g.value_info[:]
    g.value_info.extend(fgraph.value_info)
    for t in qgraph.initializer:
        if t.name in init_names:
            g.initializer.append(t)
            g.initializer[-1].name = init_names[t.name]
    produced = {o for n in qgraph.node for o in n.output if o}
    shifts = _shift_subs(qgraph, float_names)
    rewired: dict[str, str] = {}  # a local QuantizeLinear's output -> the float tensor it reads
    for suffix in (ACCUMULATED, LOCAL):
        names = {**init_names, **{o: o + suffix for o in produced}}
        for node in qgraph.node:
            copy = g.node.add()
            copy.CopyFrom(node)
            copy.name = node.name + suffix if node.name else ""
            _rename(copy, names)
            if suffix == LOCAL:
                rewired.update(_read_float(copy, node, float_names, float_inits, suffix))
                if node.name in shifts and node.input[0] in float_names - float_inits:
                    copy.input[0] = node.input[0]  # a shifted activation's Sub (see below)
        g.value_info.extend(_renamed_infos(qgraph, produced, suffix))
    fake = {
        n.output[0]: rewired[n.input[0]]
        for n in g.node
        if n.op_type == "DequantizeLinear" and n.input and n.input[0] in rewired
    }
    _merge_opsets(out, quant_model)
    return Twin(out, fake)


@contextlib.contextmanager
def pruned(model: onnx.ModelProto, wanted: Collection[str]) -> Iterator[onnx.ModelProto]:
    """``model`` with only the nodes that ``wanted`` depends on, for the duration of the
    block (a group of analyze's tensors needs a part of the three copies; onnxruntime then
    runs only that part).  The nodes are restored afterwards, even on error."""
    graph = model.graph
    saved = [onnx.NodeProto.FromString(n.SerializeToString()) for n in graph.node]
    keep = _ancestors(saved, wanted)
    del graph.node[:]
    try:
        graph.node.extend(n for i, n in enumerate(saved) if i in keep)
        yield model
    finally:
        del graph.node[:]
        graph.node.extend(saved)


def _ancestors(nodes: list[onnx.NodeProto], wanted: Collection[str]) -> set[int]:
    """Indices of the nodes that compute ``wanted`` (inputs and names their bodies read)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    keep: set[int] = set()
    todo = [producer[w] for w in wanted if w in producer]
    while todo:
        i = todo.pop()
        if i in keep:
            continue
        keep.add(i)
        reads = set(nodes[i].input)
        for attr in nodes[i].attribute:
            for body in attr_graphs(attr):
                reads |= outer_reads(body)
        todo.extend(producer[r] for r in reads if r in producer)
    return keep


def _defined(graph: onnx.GraphProto) -> set[str]:
    """Every top-level name of ``graph``: inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    return names | {o for n in graph.node for o in n.output if o}


def _rename(node: onnx.NodeProto, names: dict[str, str]) -> None:
    """Rename ``node``'s inputs and outputs, and the enclosing-scope names its bodies read."""
    for i, name in enumerate(node.input):
        node.input[i] = names.get(name, name)
    for i, name in enumerate(node.output):
        node.output[i] = names.get(name, name)
    for attr in node.attribute:
        for body in attr_graphs(attr):
            _rename_reads(body, names)


def _rename_reads(body: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename the enclosing-scope names that ``body`` (and the bodies inside it) reads."""
    local = _defined(body)
    inner = {k: v for k, v in names.items() if k not in local}
    for n in body.node:
        for i, name in enumerate(n.input):
            n.input[i] = inner.get(name, name)
        for a in n.attribute:
            for sub in attr_graphs(a):
                _rename_reads(sub, inner)


def _shift_subs(graph: onnx.GraphProto, float_names: set[str]) -> set[str]:
    """The Sub nodes that shift an activation ahead of its QuantizeLinear (``shift_activations``:
    ``Sub(x, c) [-> Pad] -> QuantizeLinear``, the Sub's output not a tensor of the float model):
    the local copy's Sub reads the float tensor, as a QuantizeLinear there does.  The
    DequantizeLinear after it holds ``x - c``, so it is not an input the ops' input error can
    be measured on."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def quantized(tensor: str, through_pad: bool) -> bool:
        nodes = readers.get(tensor, [])
        return bool(nodes) and all(
            n.op_type == "QuantizeLinear"
            or (through_pad and n.op_type == "Pad" and quantized(n.output[0], False))
            for n in nodes
        )

    return {
        n.name
        for n in graph.node
        if n.op_type == "Sub" and n.output[0] not in float_names and quantized(n.output[0], True)
    }


def _read_float(
    copy: onnx.NodeProto,
    node: onnx.NodeProto,
    float_names: set[str],
    float_inits: set[str],
    suffix: str,
) -> dict[str, str]:
    """Make a local-copy QuantizeLinear of an activation read the float copy's tensor;
    returns {its output: the float tensor it now reads}."""
    if node.op_type != "QuantizeLinear" or not node.input or node.input[0] not in float_names:
        return {}
    if node.input[0] in float_inits:  # a constant: not an activation
        return {}
    copy.input[0] = node.input[0]  # a graph input keeps its name; other tensors lose the suffix
    return {node.output[0] + suffix: node.input[0]}


def _renamed_infos(
    graph: onnx.GraphProto, produced: set[str], suffix: str
) -> list[onnx.ValueInfoProto]:
    """The value infos of ``graph``'s produced tensors under their copy's names.  A graph
    output's declared shape is the exporter's claim, which onnxruntime checks loosely for an
    output but trusts for an inner tensor's buffer (a KV cache's ``present`` declared with the
    past length): the copies keep only its element type."""
    out = []
    outputs = {vi.name for vi in graph.output}
    for vi in list(graph.value_info) + list(graph.output):
        if vi.name in produced:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(vi)
            copy.name = vi.name + suffix
            if vi.name in outputs and copy.type.HasField("tensor_type"):
                copy.type.tensor_type.ClearField("shape")
            out.append(copy)
    return out


def _merge_opsets(out: onnx.ModelProto, other: onnx.ModelProto) -> None:
    """Import every domain ``other`` uses, at the higher of the two versions."""
    have = {imp.domain: imp for imp in out.opset_import}
    for imp in other.opset_import:
        mine = have.get(imp.domain)
        if mine is None:
            out.opset_import.add().CopyFrom(imp)
        elif imp.version > mine.version:
            mine.version = imp.version
