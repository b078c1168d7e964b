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

A Q/DQ model may compute in FP16 (or BF16) what the float model computes in FP32
(``onnxq.materialize.typing``, TensorRT's default): a rewired local-copy node then reads the
float tensor through a Cast to the type the Q/DQ model holds it in, as its own node would,
also where the Q/DQ model reads it under another name (a boundary Cast's ``x_fp16``, a graph
output's ``y_fp16`` before the Cast back to ``y``); a graph input the Q/DQ model reads in FP16
(written without ``keep_io_types``) reaches both copies through a Cast of the float model's.
A graph output written low and cast back keeps its name, so both copies' ``y`` are FP32 and
compare with the float model's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import onnx

from onnxq.ir.opset import opset_version, upgrade_opset
from onnxq.ir.order import attr_graphs, outer_reads

ACCUMULATED = "@onnxq_acc"
LOCAL = "@onnxq_local"
QUANT_INIT = "@onnxq_q"
_LOW_FLOATS = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


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
    (both models read the same graph inputs; a float model of a lower default-domain opset
    is converted to the quantized model's, which onnxq may have raised: FP16 Q/DQ scales
    need opset 19)."""
    if opset_version(float_model) < opset_version(quant_model):
        float_model = upgrade_opset(float_model, opset_version(quant_model), "float model")
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
    qtypes = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in [*qgraph.input, *qgraph.value_info, *qgraph.output]
        if vi.type.HasField("tensor_type")
    }
    shifts = _shift_subs(qgraph, float_names)
    casts: dict[str, onnx.NodeProto] = {}  # float tensors the copies read in the Q/DQ's type
    # graph inputs the Q/DQ model reads in FP16/BF16 (written without keep_io_types): both
    # copies read the float model's FP32 input through a Cast
    ftypes = {vi.name: vi.type.tensor_type.elem_type for vi in fgraph.input}
    retyped = {
        x: _retyped(x, qtypes[x], casts)
        for x in inputs
        if ftypes.get(x) == onnx.TensorProto.FLOAT and qtypes.get(x) in _LOW_FLOATS
    }
    sources = _FloatSources(qgraph, float_names - float_inits, qtypes)
    copies: list[onnx.NodeProto] = []
    rewired: dict[str, str] = {}  # a local QuantizeLinear's output -> the float tensor it reads
    for suffix in (ACCUMULATED, LOCAL):
        names = {**init_names, **retyped, **{o: o + suffix for o in produced}}
        for node in qgraph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = node.name + suffix if node.name else ""
            _rename(copy, names)
            # the local copy's activation QuantizeLinear, and a shifted activation's Sub (see
            # _shift_subs), read the float copy's tensor
            reads = node.op_type == "QuantizeLinear" or bool(node.name and node.name in shifts)
            source = sources.of(node.input[0]) if suffix == LOCAL and reads else None
            if source is not None:
                copy.input[0] = _retyped(*source, casts)
                if node.op_type == "QuantizeLinear":
                    rewired[node.output[0] + suffix] = source[0]
            copies.append(copy)
        g.value_info.extend(_renamed_infos(qgraph, produced, suffix))
    g.node.extend([*casts.values(), *copies])  # the Casts read float tensors: before the copies
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


class _FloatSources:
    """Which activation of the float model a tensor of the Q/DQ model holds, and in which type:
    the tensor itself; or, where ``onnxq.materialize.typing`` wrote the Q/DQ model in FP16 or
    BF16, the tensor a boundary Cast converts (``x -> Cast -> x_fp16``), or the one a kept
    name is cast back to (a graph output or a tensor a body reads, written low as
    ``y_fp16 -> Cast -> y``)."""

    def __init__(
        self, graph: onnx.GraphProto, activations: set[str], types: dict[str, int]
    ) -> None:
        self.activations, self.types = activations, types
        self.cast_from: dict[str, tuple[str, int]] = {}  # a Cast's output -> (input, to)
        self.cast_back: dict[str, str] = {}  # a kept name's low tensor -> the kept name
        for node in graph.node:
            if node.op_type != "Cast" or not node.input or not node.output:
                continue
            to = next((int(a.i) for a in node.attribute if a.name == "to"), 0)
            source, target = node.input[0], node.output[0]
            if source in activations and target not in activations:
                self.cast_from[target] = (source, to)
            back = to == onnx.TensorProto.FLOAT and types.get(source) in _LOW_FLOATS
            if back and target in activations and source.startswith(target + "_"):
                self.cast_back[source] = target

    def of(self, name: str) -> tuple[str, int] | None:
        """(the float model's activation, the type the Q/DQ model holds it in) for ``name``;
        None: it is no activation of the float model (a constant, a tensor onnxq made)."""
        if name in self.activations:
            return name, self.types.get(name, onnx.TensorProto.FLOAT)
        if name in self.cast_back:
            return self.cast_back[name], self.types[name]
        return self.cast_from.get(name)


def _retyped(name: str, to: int, casts: dict[str, onnx.NodeProto]) -> str:
    """The float model's tensor ``name`` in type ``to``, the type the Q/DQ model holds it in,
    for a copy's node that reads it (a local QuantizeLinear, a shifted activation's Sub, a
    graph input read in FP16): itself when that is FP32, else a Cast to it (FP16/BF16,
    ``onnxq.materialize.typing``), so the node reads it as the quantized model's own node
    does (the float value, rounded to the quantized model's type); one Cast per tensor."""
    if to in (onnx.TensorProto.FLOAT, onnx.TensorProto.UNDEFINED):
        return name
    cast = f"{name}{LOCAL}_cast{to}"
    if cast not in casts:
        casts[cast] = onnx.helper.make_node("Cast", [name], [cast], name=cast, to=to)
    return cast


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
