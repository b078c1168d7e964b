"""The specs a placement rule gives a node's tensors, and why a tensor cannot have one: an
activation input, a per-channel weight, a quantized output (with a following ReLU/Clip folded
in).  The rules (``onnxq.place.rules.static``, ``weighted``, ``dynamic``) build their claims
from these."""

from __future__ import annotations

from dataclasses import replace

import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.place.rules.kernel_limits import pool_overhang_decline
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Spec, claim

# why a float tensor on the shape path (``GraphFacts.shape_path``) is not quantized
SHAPE_ONLY_DATA = (
    "computed from constants and the input's shape alone, not from its values "
    "(e.g. a zero initial state, or a position embedding resized to the input)"
)


def activation_problem(m: Match, ctx: Context, tensor: str) -> str | None:
    """Why ``tensor`` cannot be quantized as an activation (``None`` if it can)."""
    g = ctx.graph
    if not tensor:
        return "the input is missing"
    if g.is_const(tensor):
        return f"input {tensor!r} is a constant, not an activation"
    elem = g.elem_type(tensor)
    if elem is not None and elem != TensorProto.FLOAT:
        return f"tensor {tensor!r} is {TensorProto.DataType.Name(elem).lower()}, not float32"
    if tensor in ctx.shape_path:
        if elem == TensorProto.FLOAT:
            return f"tensor {tensor!r} is {SHAPE_ONLY_DATA}"
        return f"tensor {tensor!r} is part of a shape/index computation"
    excluded = ctx.options.tensor_excluded(tensor)
    if excluded:
        return f"tensor {tensor!r} excluded by {excluded}"
    return ctx.float_tensors.get(tensor)


def activation(m: Match, index: int) -> Spec:
    """The activation spec of the node's input ``index``, read by this node only."""
    return Spec(m.input(index), "activation", ((m.name, index),))


def weight_spec(m: Match, ctx: Context, index: int) -> Spec | Decline:
    """Per-channel spec of the constant weight at input ``index`` (axis from the profile)."""
    name = m.input(index)
    value = ctx.graph.const_info(name)
    if value is None:
        return Decline(f"weight {name!r} is not a constant")
    if value.dtype != "float32":
        return Decline(f"weight {name!r} is {value.dtype}, not float32")
    where = ctx.profile.weight_axes.get(m.node.op_type)
    axis = None
    if where is not None and value.ndim >= 1:
        if m.node.op_type == "MatMul" and value.ndim != 2:
            axis = None  # batched right-hand side: one scale per tensor
        else:
            axis = where.resolve(m.attrs(), value.ndim)  # type: ignore[arg-type]
    return Spec(name, "weight", ((m.name, index),), axis=axis)


def output_specs(m: Match, ctx: Context, output: str) -> Claim:
    """Q/DQ on the node's output (read by all consumers), unless :func:`output_problem`."""
    if output_problem(m, ctx, output):
        return Claim()
    return claim(Spec(output, "activation", _quantized_readers(ctx, output), output=True))


def output_problem(m: Match, ctx: Context, output: str) -> str | None:
    """Why ``output`` (a node's output) cannot get Q/DQ, or None."""
    g = ctx.graph
    if output in g.graph_outputs:
        return f"its output {output!r} is a graph output (never quantized)"
    problem = activation_problem(m, ctx, output)
    if problem:
        return problem
    if output in g.subgraph_reads:
        return f"its output {output!r} is read inside a control-flow subgraph"
    if not _quantized_readers(ctx, output):
        return f"no reader of its output {output!r} takes int8"
    if _dq_would_reach_subgraph(ctx, output):  # a DQ there aborts onnxruntime's optimizer
        return (
            f"a DequantizeLinear on its output {output!r} could end up next to a tensor a "
            "control-flow subgraph reads"
        )
    return None


def _quantized_readers(ctx: Context, output: str) -> tuple[tuple[str, int], ...]:
    return tuple(
        (n.name, i)
        for n, i in ctx.graph.consumers.get(output, [])
        if n.op_type not in ctx.profile.float_readers and not _unfaithful_kernel(ctx, n, output)
    )


def _unfaithful_kernel(ctx: Context, node: onnx.NodeProto, tensor: str) -> bool:
    """True for a reader whose integer kernel computes something else than the float op
    (:func:`pool_overhang_decline`).  It must not read a DequantizeLinear at all: onnxruntime
    moves the next QuantizeLinear back over pass-through ops (Reshape, ...) and then fuses
    DQ -> op -> Q into that kernel although the op was left float."""
    if node.op_type != "AveragePool" or node.op_type not in ctx.profile.unary_kernel_ops:
        return False
    return pool_overhang_decline(ir.node_attrs(node), ctx.graph.shape(tensor)) is not None


def _dq_would_reach_subgraph(ctx: Context, tensor: str) -> bool:
    """True if a DequantizeLinear on ``tensor`` could end up next to a tensor that a control-flow
    subgraph reads: directly, or after onnxruntime moves it forward through pass-through ops
    (Transpose, Reshape, ...)."""
    g = ctx.graph
    frontier, seen = [tensor], set()
    while frontier:
        t = frontier.pop()
        if t in seen:
            continue
        seen.add(t)
        for node, _ in g.consumers.get(t, []):
            if any(o in g.subgraph_reads for o in node.output):
                return True
            if node.op_type in ctx.profile.passthrough_ops:
                frontier.extend(o for o in node.output if o)
    return False


def quantized_output(m: Match, ctx: Context) -> Claim:
    """Output Q/DQ of a weighted op or an integer Add/Mul; a single following ReLU/Clip is
    folded in (onnxruntime drops it when the Q's range already clips): the claim then takes
    that node too, and its output gets the Q/DQ."""
    folded = folded_activation(m, ctx)
    if folded is not None:
        outs = output_specs(m, ctx, folded.output[0])
        if not outs:
            return Claim()
        # a ReLU/Clip output is bounded by the activation itself: not a raw requantization
        return Claim(tuple(replace(s, output=False) for s in outs.specs), (folded.name,))
    return output_specs(m, ctx, m.node.output[0])


def folded_activation(m: Match, ctx: Context) -> onnx.NodeProto | None:
    """The single ReLU/Clip reader whose output takes the node's output Q/DQ, if any."""
    out = m.node.output[0]
    readers = ctx.graph.consumers.get(out, [])
    if len(readers) == 1 and out not in ctx.graph.graph_outputs:
        nxt, _ = readers[0]
        if nxt.op_type in ctx.profile.folded_activations and nxt.name not in ctx.claimed:
            return nxt
    return None
