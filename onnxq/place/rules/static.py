"""Placement rules of static quantization (the rule sets in ``onnxq.place.rules.sets``).

Each rule anchors on one op type family and says which of the node's tensors get Q/DQ.  Order
is priority: the first rule of a node's op type that does not decline claims the node.  What a
rule needs to know about the backend (weight axes, whether outputs are quantized, bias mode,
channel thresholds) comes from the profile, never from a branch on the backend's name.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.place.rules.cost import chain_decline, cost_decline, kernel_terms
from onnxq.place.rules.kernel_limits import (
    conv_kernel_decline,
    conv_reduction,
    long_reduction,
    pool_overhang_decline,
)
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Spec, claim, rule

CONV_LIKE = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
# why a float tensor on the shape path (``GraphFacts.shape_path``) is not quantized
SHAPE_ONLY_DATA = (
    "computed from constants and the input's shape alone, not from its values "
    "(e.g. a zero initial state, or a position embedding resized to the input)"
)


# --------------------------------------------------------------------------- helpers
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
    folded = _folded_activation(m, ctx)
    if folded is not None:
        outs = output_specs(m, ctx, folded.output[0])
        if not outs:
            return Claim()
        # a ReLU/Clip output is bounded by the activation itself: not a raw requantization
        return Claim(tuple(replace(s, output=False) for s in outs.specs), (folded.name,))
    return output_specs(m, ctx, m.node.output[0])


def _folded_activation(m: Match, ctx: Context) -> onnx.NodeProto | None:
    """The single ReLU/Clip reader whose output takes the node's output Q/DQ, if any."""
    out = m.node.output[0]
    readers = ctx.graph.consumers.get(out, [])
    if len(readers) == 1 and out not in ctx.graph.graph_outputs:
        nxt, _ = readers[0]
        if nxt.op_type in ctx.profile.folded_activations and nxt.name not in ctx.claimed:
            return nxt
    return None


def small_decline(op: str, k: int, n: int, ctx: Context, note: str = "") -> Decline | None:
    """The small-op rule: an op with fewer than ``min_channels`` input (``k``) or output
    (``n``) channels stays float; ``note`` adds to the reason (a Conv's products per output)."""
    limit = ctx.min_channels
    if limit and (k < limit or n < limit):
        return Decline(
            f"{op} with {k} input / {n} output channels (min_channels={limit}: fewer than "
            f"{limit} on either side{note}): INT8 does not "
            "pay for it, it stays float"
        )
    return None


def weighted_op(
    m: Match,
    ctx: Context,
    k: int,
    n: int,
    macs_per_output: int | None = None,
    grouped: bool = False,
    unaligned: bool = False,
    long_k: int | None = None,
) -> Claim | Decline:
    """Activation input 0 + weight input 1 (+ int32 bias, output Q/DQ where the profile asks).

    ``macs_per_output`` (products summed per output element), ``grouped`` and ``unaligned``
    feed the profile's cost rules (:func:`onnxq.place.rules.cost.kernel_terms`); ``None``
    (ConvTranspose, not measured) skips them.  ``long_k``: a Conv's products per output where
    they exempt it from the small-op rule
    (:func:`onnxq.place.rules.kernel_limits.long_reduction`)."""
    kernels = ctx.profile.integer_kernel_ops
    if kernels and m.node.op_type not in kernels:
        return Decline(
            f"{ctx.profile.name} has no integer {m.node.op_type} kernel: Q/DQ around it would "
            "only add work and rounding error"
        )
    problem = activation_problem(m, ctx, m.input(0))
    if problem:
        return Decline(problem)
    small = None if long_k else small_decline(m.node.op_type, k, n, ctx, _short_note(m, ctx))
    if small:
        return small
    costly = cost_decline(m, ctx, macs_per_output, grouped, unaligned) if macs_per_output else None
    if costly:
        return costly
    w = weight_spec(m, ctx, 1)
    if isinstance(w, Decline):
        return w
    taken = claim(activation(m, 0), w)
    bias = m.input(2)
    if bias and ctx.profile.bias == "int32" and ctx.graph.const_info(bias) is not None:
        taken += claim(Spec(bias, "bias", ((m.name, 2),), axis=0, inputs=(m.input(0), m.input(1))))
    if ctx.profile.quantize_outputs:
        outs = quantized_output(m, ctx)
        if not outs and m.node.op_type not in ctx.profile.float_output_kernel_ops:
            folded = _folded_activation(m, ctx)
            tensor = folded.output[0] if folded is not None else m.node.output[0]
            why = output_problem(m, ctx, tensor) or "its output cannot be quantized"
            return Decline(
                f"{why}, and {ctx.profile.name} has no integer {m.node.op_type} with a float "
                "output: Q/DQ on its inputs alone would only add work"
            )
        taken += outs
    return taken


# a channel (or kernel) peaking below this share of the largest one under the same int8 scale
# gets fewer than 8 of its 127 levels
WEAK_SHARE = 1 / 16


def _shared_weight_scale(w: np.ndarray, group: int) -> str | None:
    """Why a grouped ConvTranspose's weight cannot be quantized, or None.

    Its weight is [C_in, K/g, kh, kw] and the per-channel axis is 1 (what TensorRT requires),
    so one scale covers output channel j of every group: a depthwise ConvTranspose (K/g = 1)
    gets one scale for all its kernels.  With BatchNormalization folded in, their peaks can
    differ by 100x or more (a speech-enhancement decoder: 244x and 357x), and the small kernels
    round to zero."""
    if group <= 1 or w.shape[0] % group:
        return None
    peaks = np.abs(w.reshape(group, w.shape[0] // group, w.shape[1], -1)).max(axis=(1, 3))
    worst = 0.0
    for column in peaks.T:  # the g kernels under one scale
        nonzero = column[column > 0]
        if nonzero.size >= 2:
            worst = max(worst, float(nonzero.max() / nonzero.min()))
    if worst * WEAK_SHARE <= 1.0:
        return None
    return (
        f"grouped ConvTranspose (group={group}): its per-channel weight axis (1, "
        f"{w.shape[1]} scales) shares each scale across the {group} groups, whose kernels' "
        f"peaks differ up to {worst:.0f}x (> {round(1 / WEAK_SHARE)}x): int8 would leave the "
        "small ones under 8 levels, so it stays float"
    )


# --------------------------------------------------------------------------- rules
@rule("conv", "Conv", "ConvTranspose")
def conv(m: Match, ctx: Context) -> Claim | Decline:
    """Conv/ConvTranspose: activation per-tensor, weight per output channel."""
    w = ctx.graph.const_info(m.input(1))
    if w is None or w.ndim < 3:
        return Decline(f"weight {m.input(1)!r} is not a constant of rank >= 3")
    group = int(m.attrs().get("group", 1))  # type: ignore[call-overload]
    per_output, unaligned = None, False
    limited = conv_kernel_decline(ctx.profile, w.shape) if m.node.op_type == "Conv" else None
    if limited:  # FP8: the convs TensorRT's FP8 kernels take
        return limited
    if m.node.op_type == "Conv":
        out_c, in_c = w.shape[0], w.shape[1] * group
        per_output, _, unaligned = kernel_terms(ctx, m.node) or (None, False, False)
    else:
        in_c, out_c = w.shape[0], w.shape[1] * group
        values = ctx.graph.const_value(m.input(1))
        assert values is not None
        shared = _shared_weight_scale(values, group)
        if shared is not None:
            return Decline(shared)
    if group > 1 and ctx.min_channels:  # the small-op rule's grouped case (the profile's)
        kernel = min(w.shape[2:])
        multiple, min_kernel = ctx.profile.grouped_channel_multiple, ctx.profile.grouped_min_kernel
        if out_c % multiple or kernel < min_kernel:
            return Decline(
                f"grouped conv (group={group}) with {out_c} output channels and kernel {kernel}: "
                f"INT8 pays only when out_channels % {multiple} == 0 and kernel >= {min_kernel}"
            )
        return weighted_op(m, ctx, max(in_c, ctx.min_channels), out_c, per_output, True)
    long_k = long_reduction(ctx.profile, w.shape, group) if m.node.op_type == "Conv" else None
    return weighted_op(m, ctx, in_c, out_c, per_output, group > 1, unaligned, long_k)


def _short_note(m: Match, ctx: Context) -> str:
    """How far a group-1 Conv falls short of the profile's ``long_conv_reduction`` ("" if it
    does not apply)."""
    limit = ctx.profile.long_conv_reduction
    w = ctx.graph.const_info(m.input(1))
    group = int(m.attrs().get("group", 1))  # type: ignore[call-overload]
    if not limit or m.node.op_type != "Conv" or group != 1 or w is None or w.ndim < 3:
        return ""
    return f", and {conv_reduction(w.shape)} products per output, fewer than {limit}"


@rule("gemm", "Gemm")
def gemm(m: Match, ctx: Context) -> Claim | Decline:
    """Gemm with a constant B: A per-tensor, B per output channel (axis from transB)."""
    b = ctx.graph.const_info(m.input(1))
    if b is None or b.ndim != 2:
        return Decline("B is not a constant matrix (activation x activation Gemm stays float)")
    trans_b = int(m.attrs().get("transB", 0))  # type: ignore[call-overload]
    k, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    return weighted_op(m, ctx, k, n, k)


@rule("matmul", "MatMul")
def matmul(m: Match, ctx: Context) -> Claim | Decline:
    """MatMul with a constant right-hand side [K, N]: weight per column (axis 1)."""
    b = ctx.graph.const_info(m.input(1))
    if b is None:
        return Decline("activation x activation MatMul (attention core) stays float by default")
    if b.ndim < 2:
        return Decline("right-hand side is a vector (GEMV): INT8 does not pay")
    return weighted_op(m, ctx, b.shape[-2], b.shape[-1], b.shape[-2])


def _shape_text(shape: tuple[int | str | None, ...] | None) -> str:
    if shape is None:
        return "(unknown)"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@rule("residual_add", "Add")
def residual_add(m: Match, ctx: Context) -> Claim | Decline:
    """Residual Add: Q/DQ on the skip input only, so the Add fuses into the epilogue of the
    quantized op it reads (one of the profile's ``residual_producers``)."""
    g = ctx.graph
    a, b = m.input(0), m.input(1)
    for t in (a, b):
        problem = activation_problem(m, ctx, t)
        if problem:
            return Decline(problem)
    same = g.same_shape(a, b)
    if g.shape(a) is not None and not same:
        differ = (
            "have different shapes" if same is False else "have shapes that cannot be shown equal"
        )
        return Decline(
            f"inputs {differ}, {_shape_text(g.shape(a))} and "
            f"{_shape_text(g.shape(b))} (a broadcast Add is not a residual)"
        )

    def fusable(t: str) -> bool:
        producer = g.producer.get(t)
        return (
            producer is not None
            and producer.op_type in ctx.profile.residual_producers
            and producer.name in ctx.claimed
            and len(g.consumers.get(t, [])) == 1
        )

    if fusable(a):
        return claim(activation(m, 1))
    if fusable(b):
        return claim(activation(m, 0))
    producers = "/".join(sorted(ctx.profile.residual_producers)) or "weighted op"
    return Decline(
        f"neither input comes straight from a quantized {producers}, so the Add "
        "cannot fuse as a residual; it stays float"
    )


@rule("binary", "Add", "Mul")
def binary(m: Match, ctx: Context) -> Claim | Decline:
    """Add/Mul of two activations with input and output Q/DQ (QLinearAdd/QLinearMul)."""
    for index in (0, 1):
        problem = activation_problem(m, ctx, m.input(index))
        if problem:
            return Decline(problem)
    chain = chain_decline(m, ctx, [m.input(0), m.input(1)])
    if chain:
        return chain
    # a ReLU after the Add (ResNet's residual join) folds into its output quantization, unless
    # the ReLU's output is a graph output: then the Q/DQ goes between the two
    outs = quantized_output(m, ctx) or output_specs(m, ctx, m.node.output[0])
    return claim(activation(m, 0), activation(m, 1)) + outs


@rule("concat", "Concat", shares_scale=True)
def concat(m: Match, ctx: Context) -> Claim | Decline:
    """Concat of activations with input and output Q/DQ (QLinearConcat)."""
    for index in range(len(m.node.input)):
        problem = activation_problem(m, ctx, m.input(index))
        if problem:
            return Decline(problem)
    chain = chain_decline(m, ctx, list(m.node.input))
    if chain:
        return chain
    outs = output_specs(m, ctx, m.node.output[0])
    if not outs:
        return Decline("its output is a graph output or unread; the concat stays float")
    return claim(*(activation(m, i) for i in range(len(m.node.input)))) + outs


@rule("unary", profile_ops=lambda profile: profile.unary_kernel_ops)
def unary(m: Match, ctx: Context) -> Claim | Decline:
    """Single-input ops the backend runs as integer kernels (the profile's
    ``unary_kernel_ops``: QLinearSigmoid, ...): input and output Q/DQ."""
    problem = activation_problem(m, ctx, m.input(0))
    if problem:
        return Decline(problem)
    if m.node.op_type == "AveragePool":
        overhang = pool_overhang_decline(m.attrs(), ctx.graph.shape(m.input(0)))
        if overhang:
            return overhang
    chain = chain_decline(m, ctx, [m.input(0)])
    if chain:
        return chain
    outs = output_specs(m, ctx, m.node.output[0])
    if not outs:
        return Decline("its output is a graph output or unread; no integer kernel to fuse")
    return claim(activation(m, 0)) + outs


@rule(
    "passthrough",
    "MaxPool",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Resize",
    "DepthToSpace",
    "SpaceToDepth",
)
def passthrough(m: Match, ctx: Context) -> Claim | Decline:
    """An op that only moves values, on a quantized input: its output shares the input's
    qparams, so onnxruntime drops the Q/DQ pair and runs it on int8 data."""
    x = m.input(0)
    if ctx.quantized.get(x) not in ("activation", "shared"):
        return Decline("its input is not quantized, so there is no Q/DQ pair to carry through")
    if m.node.op_type not in ctx.profile.passthrough_ops:
        return Decline(f"{m.node.op_type} is not a pass-through op for {ctx.profile.name}")
    out = m.node.output[0]
    outs = output_specs(m, ctx, out)
    if not outs:
        return Decline("its output is a graph output or unread")
    return claim(activation(m, 0), Spec(out, "shared", outs.specs[0].consumers, inputs=(x,)))
