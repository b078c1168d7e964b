"""Which activations are quantized shifted (``shift_activations``).

With symmetric integer activations (TensorRT's), a tensor that is never below 0 (a Relu or
ReLU6 output) uses half the grid: its range ``[0, R]`` gets the integers ``0..127``. Its
readers can take ``x - R/2`` instead, on ``-127..127``, twice the steps over the same range,
when each reader can add ``R/2`` back exactly: a Conv or Gemm whose bias absorbs
``R/2 * sum(W)`` per output channel (with the weights as they are quantized, so that the
weights' rounding error stays what it was). A reader that pads must pad with ``-R/2``: it
gets a Pad before the QuantizeLinear, so only a tensor with that one quantized reader
qualifies. ``materialize`` writes the Sub, the Pad and the biases
(:mod:`onnxq.materialize.shift`).
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.numerics.precisions import tensor_qtype
from onnxq.place.annotations import TensorAnnotation


def mark_shifts(
    graph: ir.Graph, profile: BackendProfile, tensors: dict[str, TensorAnnotation]
) -> list[str]:
    """Set ``shift`` on every activation of ``graph`` (its top level) that qualifies;
    returns the report's note: how many did, or why the option does nothing for ``profile``
    (dynamic kernels, or activations with a zero point)."""
    if profile.dynamic:
        return [
            "shift_activations does nothing here: dynamic kernels quantize activations at run time"
        ]
    if not profile.activation_symmetric:
        return [
            f"shift_activations does nothing for backend {profile.name}: its activations "
            "have a zero point that already puts a non-negative range on the whole grid"
        ]
    shared = {a.inputs[0] for a in tensors.values() if a.kind == "shared" and a.inputs}
    shifted = 0
    declined: Counter[str] = Counter()
    for ann in tensors.values():
        if ann.kind != "activation" or ann.tensor in shared or not _candidate(graph, profile, ann):
            continue
        why = _declined(graph, ann, tensors)
        if why is None:
            ann.shift = True
            shifted += 1
        else:
            declined[why] += 1
    note = (
        f"shift_activations: {shifted} non-negative activations read only by Conv/Gemm are "
        "quantized shifted down by half their range, on the whole grid"
    )
    if declined:
        others = "; ".join(f"{n} {why}" for why, n in sorted(declined.items()))
        note += f"; not shifted: {others}"
    return [note]


def _candidate(graph: ir.Graph, profile: BackendProfile, ann: TensorAnnotation) -> bool:
    """A never-negative float activation on a symmetric integer grid: the shift's subject."""
    qtype = tensor_qtype("activation", ann.settings.precision, profile.activation_dtype)
    if qtype.is_float or not qtype.signed or ann.settings.symmetric is False:
        return False
    if not ann.consumers or graph.elem_type(ann.tensor) != TensorProto.FLOAT:
        return False
    return graph.nonnegative(ann.tensor)


def _declined(
    graph: ir.Graph, ann: TensorAnnotation, tensors: dict[str, TensorAnnotation]
) -> str | None:
    """Why a candidate's readers cannot take it shifted (None: they can)."""
    readers = []
    for name, index in ann.consumers:
        node = graph.node_by_name(name)
        if node is None:
            return "read inside a control-flow body"
        if index != 0:
            return f"read as input {index} of a {node.op_type}, not as its data input"
        why = _cannot_absorb(graph, node, tensors)
        if why is not None:
            return why
        readers.append(node)
    if len(readers) > 1 and any(pads_of(node) for node in readers):
        return "read by several quantized layers, one of them padding (a Pad serves one reader)"
    return None


def _cannot_absorb(
    graph: ir.Graph, node: onnx.NodeProto, tensors: dict[str, TensorAnnotation]
) -> str | None:
    """Why ``node`` cannot add a constant shift of its first input back through its bias
    (None: it can: a Conv with explicit pads, or a Gemm with alpha = beta = 1 that does not
    transpose it, with a constant weight and a float constant bias or none)."""
    attrs = ir.node_attrs(node)
    if node.op_type == "Conv":
        if attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
            return "read by a Conv with auto_pad"
    elif node.op_type == "Gemm":
        if int(attrs.get("transA", 0)):
            return "read by a Gemm that transposes it"
        if float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0:
            return "read by a Gemm with alpha or beta other than 1"
    else:
        return f"read by a quantized {node.op_type} (only Conv and Gemm add the shift back)"
    weight = graph.const_value(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim < 2:
        return f"read by a {node.op_type} whose weight is not a constant"
    bias = node.input[2] if len(node.input) > 2 else ""
    if not bias:
        return None
    value = graph.const_value(bias)
    transposed = node.op_type == "Conv" or int(attrs.get("transB", 0))
    outputs = weight.shape[0] if transposed else weight.shape[1]
    if (
        value is None
        or value.shape != (outputs,)
        or graph.elem_type(bias) != TensorProto.FLOAT
        or (bias in tensors and tensors[bias].kind == "bias")
    ):
        return f"read by a {node.op_type} whose bias is not one float constant per output"
    return None


def pads_of(node: onnx.NodeProto) -> list[int]:
    """A Conv's explicit pads when any is not 0, else ``[]``."""
    if node.op_type != "Conv":
        return []
    pads = [int(p) for p in ir.node_attrs(node).get("pads", [])]
    return pads if any(pads) else []
