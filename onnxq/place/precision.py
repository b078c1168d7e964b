"""The precision of what stays float: one plan for every float compute node of a Q/DQ graph.

TensorRT 11 builds strongly typed networks: the ONNX tensor types are the precisions, so a node
onnxq leaves float runs in FP32 unless the graph says FP16 (or BF16).  :func:`plan_precisions`
gives each float compute node of the written Q/DQ graph the run's high precision
(``high_precision``: ``fp16`` for TensorRT by default), or FP32 with the reason, from the data
onnxq already has:

* an activation whose calibrated peak passes :data:`FP16_LIMIT` (FP16's largest value, 65504,
  with :data:`HEADROOM` to spare) keeps its producer and readers in FP32; a BF16 plan has
  FP32's range and keeps nothing for range;
* an activation whose peak is below FP16's smallest normal value (``2**-14``) and not zero
  would lose its digits in FP16 (BF16 has FP32's exponent: no such rule);
* a weight or constant beyond the low type's range, and a Q/DQ scale below FP16's smallest
  normal value (a near-empty weight channel's: FP16 would round it towards zero);
* a node whose op has no FP16/BF16 form in the ONNX operator set, a custom-domain op, a
  control-flow node (its bodies read outer tensors by name) and a node with an activation the
  calibration could not observe: FP32, each with its reason.

Quantize/Dequantize nodes are not planned: they take the precision of the tensors around them
(:func:`onnxq.materialize.typing.write_precisions`, which writes the plan); nor is a node
without a float output (Shape, Greater, ArgMax): it reads its inputs in the type they have.
The plan is data: the report's precision split and ``onnxq explain`` read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxq import ir
from onnxq.config.placement import HIGH_PRECISIONS

LOW_TYPES = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
FP16_MAX = 65504.0
HEADROOM = 4.0  # an activation may reach FP16_MAX / HEADROOM: unseen inputs go further
FP16_LIMIT = FP16_MAX / HEADROOM
FP16_MIN_NORMAL = 2.0**-14
BF16_MAX = 3.3895313892515355e38

# ops whose float outputs are not arithmetic on their inputs: they follow the plan of the
# nodes around them (the writer types them), never decide it
FOLLOWERS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class PrecisionPlan:
    """Each float compute node's precision: ``low`` holds the nodes in the run's high
    precision (``high``: ``fp16``/``bf16``), ``kept`` the FP32 ones with the reason.  A plan
    with ``high == "fp32"`` keeps every node in its type and says nothing."""

    high: str
    low: frozenset[str] = frozenset()
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def low_type(self) -> int | None:
        """The ONNX element type of the low nodes (None: an FP32 plan)."""
        return LOW_TYPES.get(self.high)


def float_constraints(node: onnx.NodeProto, graph: ir.Graph, opset: int) -> set[str] | None:
    """The type constraints of ``node``'s schema that bind FLOAT in this node (``T`` of an
    FP32 Conv); None for a node without a schema (a custom domain)."""
    schema = _schema(node, opset)
    if schema is None:
        return None
    names = {c.type_param_str for c in schema.type_constraints}
    bound: set[str] = set()
    for formal, actual in _bindings(schema, node):
        if formal in names and graph.elem_type(actual) == onnx.TensorProto.FLOAT:
            bound.add(formal)
    return bound


def _schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _bindings(schema: onnx.defs.OpSchema, node: onnx.NodeProto) -> list[tuple[str, str]]:
    """(type string of the formal parameter, actual tensor name) for every input and output
    of ``node`` (a variadic last formal takes the rest)."""
    out: list[tuple[str, str]] = []
    for formals, actuals in ((schema.inputs, node.input), (schema.outputs, node.output)):
        for i, name in enumerate(actuals):
            if not name or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]
            out.append((formal.type_str, name))
    return out


def tied_names(node: onnx.NodeProto, opset: int, constraints: set[str]) -> list[str]:
    """The inputs and outputs of ``node`` whose formal type is one of ``constraints`` (the
    tensors that change type with the node)."""
    schema = _schema(node, opset)
    if schema is None:
        return []
    return [name for formal, name in _bindings(schema, node) if formal in constraints]


def fixed_float(node: onnx.NodeProto, opset: int) -> list[str]:
    """The inputs of ``node`` that its schema types as FLOAT alone (NonMaxSuppression's boxes,
    Resize's scales): they stay FP32 whatever the node's precision."""
    schema = _schema(node, opset)
    if schema is None:
        return []
    fixed = [name for formal, name in _bindings(schema, node) if formal == "tensor(float)"]
    return [n for n in fixed if n in node.input]


def allows(node: onnx.NodeProto, opset: int, constraints: set[str], low: int) -> bool:
    """Whether every one of ``constraints`` of ``node``'s schema admits the low type."""
    schema = _schema(node, opset)
    if schema is None:
        return False
    names: dict[int, str] = {
        onnx.TensorProto.FLOAT16: "float16",
        onnx.TensorProto.BFLOAT16: "bfloat16",
        onnx.TensorProto.FLOAT: "float",
    }
    if low not in names:
        return False
    wanted = f"tensor({names[low]})"
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    return all(wanted in allowed.get(c, set()) for c in constraints)


def plan_precisions(
    model: onnx.ModelProto, peaks: Mapping[str, float], high: str, unobserved: Mapping[str, str]
) -> PrecisionPlan:
    """The precision of each float compute node of the Q/DQ ``model`` (see the module):
    ``peaks``: each activation's calibrated largest magnitude (by name; a Q/DQ pair's output
    is its input's), ``unobserved``: tensors the calibration could not observe, with why."""
    low = LOW_TYPES.get(high)
    if low is None:
        return PrecisionPlan(high)
    graph = ir.Graph(ir.infer_shapes(model))
    opset = ir.opset_version(model)
    limit = FP16_LIMIT if low == onnx.TensorProto.FLOAT16 else BF16_MAX
    lowered: set[str] = set()
    kept: dict[str, str] = {}
    for node in graph.nodes:
        if node.op_type in FOLLOWERS:
            continue
        constraints = float_constraints(node, graph, opset)
        if constraints is not None and not _writes_float(node, graph, opset, constraints):
            continue  # no float output (Shape, Greater): it follows its inputs' type
        why = _reason(node, graph, opset, constraints, low, limit, peaks, unobserved)
        if why is None:
            lowered.add(node.name)
        else:
            kept[node.name] = why
    return PrecisionPlan(high, frozenset(lowered), kept)


def _reason(
    node: onnx.NodeProto,
    graph: ir.Graph,
    opset: int,
    constraints: set[str] | None,
    low: int,
    limit: float,
    peaks: Mapping[str, float],
    unobserved: Mapping[str, str],
) -> str | None:
    """Why ``node`` stays FP32, or None: it runs in the low type."""
    name = "FP16" if low == onnx.TensorProto.FLOAT16 else "BF16"
    if constraints is None:
        return f"custom-domain op {node.domain}::{node.op_type}: onnxq cannot type it"
    if any(ir.attr_graphs(a) for a in node.attribute):
        return "control flow: its bodies read outer tensors by name and keep their types"
    if not allows(node, opset, constraints, low):
        return f"{node.op_type} has no {name} form in ONNX opset {opset}"
    for tensor in tied_names(node, opset, constraints):
        if graph.elem_type(tensor) != onnx.TensorProto.FLOAT:
            continue
        if tensor in graph.initializers or tensor in graph.constant_nodes:
            value = graph.const_value(tensor)
            big = value is not None and value.size and float(np.max(np.abs(value))) > FP16_MAX
            if big and low == onnx.TensorProto.FLOAT16:
                return f"constant {tensor!r} holds values beyond FP16's range (65504)"
            continue
        scale = _dq_scale(graph, tensor)
        if scale is not None and low == onnx.TensorProto.FLOAT16:
            small = float(np.min(np.abs(scale))) if scale.size else 1.0
            if small < FP16_MIN_NORMAL:
                return (
                    f"the scale of {tensor!r} goes down to {small:.3g}, below FP16's smallest "
                    f"normal value ({FP16_MIN_NORMAL:.3g}): an FP16 scale would lose it"
                )
        if tensor in unobserved:
            return f"activation {tensor!r} was not observed ({unobserved[tensor]})"
        peak = peaks.get(_source(graph, tensor))
        if peak is None:
            continue  # a Q/DQ output whose range the quantized tensor bounds
        if peak > limit:
            return (
                f"activation {tensor!r} reaches {peak:.4g} on the calibration data, beyond "
                f"{name}'s range with headroom ({limit:.0f} = {FP16_MAX:.0f} / {HEADROOM:g})"
            )
        if low == onnx.TensorProto.FLOAT16 and 0.0 < peak < FP16_MIN_NORMAL:
            return (
                f"activation {tensor!r} peaks at {peak:.3g}, below FP16's smallest normal "
                f"value ({FP16_MIN_NORMAL:.3g}): FP16 would keep few of its digits"
            )
    return None


def _writes_float(node: onnx.NodeProto, graph: ir.Graph, opset: int, constraints: set[str]) -> bool:
    """Whether ``node`` writes a float tensor of one of its float constraints."""
    tied = set(tied_names(node, opset, constraints))
    return any(o in tied for o in node.output if o)


def _dq_scale(graph: ir.Graph, tensor: str) -> np.ndarray | None:
    """The scale of the DequantizeLinear that writes ``tensor`` (None: another producer)."""
    node = graph.producer.get(tensor)
    if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 2:
        return None
    return graph.const_value(node.input[1])


def _source(graph: ir.Graph, tensor: str) -> str:
    """The tensor a Dequantize output stands for (its Quantize's input), else itself."""
    node = graph.producer.get(tensor)
    if node is not None and node.op_type == "DequantizeLinear":
        q = graph.producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            return q.input[0]
    return tensor


def float_activations(model: onnx.ModelProto) -> list[str]:
    """The float tensors of the top-level graph that the calibration can observe: the graph
    inputs and the float outputs of its nodes (what a precision plan reads the peaks of)."""
    graph = ir.Graph(ir.infer_shapes(model) if not model.graph.value_info else model)
    names = [*graph.graph_inputs, *(o for n in graph.nodes for o in n.output if o)]
    out = [
        n
        for n in dict.fromkeys(names)
        if graph.elem_type(n) == onnx.TensorProto.FLOAT and n not in graph.constant_nodes
    ]
    return out


__all__ = [
    "FP16_LIMIT",
    "HIGH_PRECISIONS",
    "LOW_TYPES",
    "PrecisionPlan",
    "fixed_float",
    "float_activations",
    "float_constraints",
    "plan_precisions",
    "tied_names",
]
