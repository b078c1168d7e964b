"""Which activations are quantized shifted (``shift_activations``).

With symmetric integer activations (TensorRT's), a tensor that is never below 0 (a Relu or
ReLU6 output) uses half the grid: its range ``[0, R]`` gets the integers ``0..127``. Its
readers can take ``x - R/2`` instead, on ``-127..127``, twice the steps over the same range,
when each reader can add ``R/2`` back exactly: a Conv or Gemm whose bias absorbs
``R/2 * sum(W)`` per output channel (with the weights as they are quantized, so that the
weights' rounding error stays what it was). A reader that pads must pad with ``-R/2``: it
gets a Pad before the QuantizeLinear, so only a tensor with that one quantized reader
qualifies. ``materialize`` writes the Sub, the Pad and the biases
(:mod:`onnxq.materialize_shift`).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.place.annotations import TensorAnnotation
from onnxq.precisions import tensor_qtype


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
    for ann in tensors.values():
        if ann.kind != "activation" or ann.tensor in shared:
            continue
        if _qualifies(graph, profile, ann, tensors):
            ann.shift = True
            shifted += 1
    return [
        f"shift_activations: {shifted} non-negative activations read only by Conv/Gemm are "
        "quantized shifted down by half their range, on the whole grid"
    ]


def _qualifies(
    graph: ir.Graph,
    profile: BackendProfile,
    ann: TensorAnnotation,
    tensors: dict[str, TensorAnnotation],
) -> bool:
    qtype = tensor_qtype("activation", ann.settings.precision, profile.activation_dtype)
    if qtype.is_float or not qtype.signed or ann.settings.symmetric is False:
        return False
    if not ann.consumers or graph.elem_type(ann.tensor) != TensorProto.FLOAT:
        return False
    if not graph.nonnegative(ann.tensor):
        return False
    readers = []
    for name, index in ann.consumers:
        node = graph.node_by_name(name)
        if node is None or index != 0 or not _absorbs(graph, node, tensors):
            return False  # a reader in a control-flow body, or one that cannot add it back
        readers.append(node)
    return len(readers) == 1 or not any(pads_of(node) for node in readers)


def _absorbs(graph: ir.Graph, node: onnx.NodeProto, tensors: dict[str, TensorAnnotation]) -> bool:
    """Whether ``node`` can add a constant shift of its first input back through its bias:
    a Conv with explicit pads, or a Gemm with alpha = beta = 1 that does not transpose it,
    with a constant weight and a float constant bias (or none)."""
    attrs = ir.node_attrs(node)
    if node.op_type == "Conv":
        if attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
            return False
    elif node.op_type == "Gemm":
        if int(attrs.get("transA", 0)) or float(attrs.get("alpha", 1.0)) != 1.0:
            return False
        if float(attrs.get("beta", 1.0)) != 1.0:
            return False
    else:
        return False
    weight = graph.const_value(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim < 2:
        return False
    bias = node.input[2] if len(node.input) > 2 else ""
    if not bias:
        return True
    value = graph.const_value(bias)
    transposed = node.op_type == "Conv" or int(attrs.get("transB", 0))
    outputs = weight.shape[0] if transposed else weight.shape[1]
    return (
        value is not None
        and value.shape == (outputs,)
        and graph.elem_type(bias) == TensorProto.FLOAT
        and (bias not in tensors or tensors[bias].kind != "bias")
    )


def pads_of(node: onnx.NodeProto) -> list[int]:
    """A Conv's explicit pads when any is not 0, else ``[]``."""
    if node.op_type != "Conv":
        return []
    pads = [int(p) for p in ir.node_attrs(node).get("pads", [])]
    return pads if any(pads) else []
