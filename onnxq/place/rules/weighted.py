"""Placement rules of the weighted ops (Conv, ConvTranspose, Gemm, MatMul): activation input,
per-channel weight, int32 bias and output Q/DQ where the profile asks, unless the op is too
small or too costly to pay for INT8 (the small-op rule, the profile's cost rules)."""

from __future__ import annotations

import numpy as np

from onnxq.place.rules.cost import cost_decline, kernel_terms
from onnxq.place.rules.kernel_limits import conv_kernel_decline, conv_reduction, long_reduction
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Spec, claim, rule
from onnxq.place.rules.specs import (
    activation,
    activation_problem,
    folded_activation,
    output_problem,
    quantized_output,
    weight_spec,
)


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
            folded = folded_activation(m, ctx)
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
