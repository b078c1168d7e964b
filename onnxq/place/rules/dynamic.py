"""Placement rules of dynamic quantization (``--dynamic``): which ops get onnxruntime's
dynamically quantized kernels.

A MatMul or Gemm with a constant 2-D weight becomes DynamicQuantizeMatMul and an LSTM becomes
DynamicQuantizeLSTM (``onnxq.materialize.dynamic``): the weight is stored int8 per output channel
ahead of time, the activation input is quantized by the kernel at run time.  The rules claim the
same tensors as the static rules (activation input 0, the weight), so what stays float is decided
the same way: shape paths, excluded nodes and tensors, ops on a logarithm's path, custom domains,
and every op without a rule here (LayerNorm, Softmax, GELU, attention's activation x activation
MatMuls).  Ops inside If/Loop/Scan bodies are placed like top-level ones.
"""

from __future__ import annotations

import math
from dataclasses import replace

import onnx

from onnxq import ir
from onnxq.numerics.qparams import one_scale_sqnr_db
from onnxq.place.rules.gated import OutlierSplit, linear_factor, outlier_channels
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Spec, claim, rule
from onnxq.place.rules.specs import activation, activation_problem, weight_spec
from onnxq.place.rules.weighted import small_decline

# what a Decision says of the bias Add a DynamicQuantizeMatMul takes in
KERNEL_BIAS = "kernel (it adds this bias itself)"

GATED_OUTLIERS = OutlierSplit(ratio=4.0, most=8)
"""The channels of a gated product that ``dynamic_gated_matmul`` computes in float.  Measured
on smollm2_135m, perplexity over the first 8 of the 64 evaluation windows (float 19.09; every
down projection float 20.34; all quantized whole 30.04; onnxruntime's quantize_dynamic 31.99):
ratio 2 / at most 16 channels (27 of the 30 projections split) 22.01; ratio 4 / 8 (7 split)
22.14; ratio 6 / 8 (4 split) 23.18.  Each split costs a Gather, a small MatMul and an Add,
which a 1-token step feels (0.5% of smollm2_135m's kernel time with 7); ratio 4 keeps the
ones that matter."""


ONE_SCALE_SQNR_DB = 30.0
"""``dynamic_weight_scales="auto"`` (:data:`onnxq.config.options.DYNAMIC_WEIGHT_SCALES`): a weight
whose int8 rounding under one scale for the whole tensor keeps an SQNR of at least this
(``onnxq.numerics.qparams.one_scale_sqnr_db``) gets one scale; the others one per column.
onnxruntime's kernels take a per-column scale down a slower path when few rows are multiplied
(x86-vnni, onnxruntime 1.32, one thread, DynamicQuantizeMatMul at one row: 576x1536 22% slower, the
576x49152 LM head 17%, 1536x576 6%; at 512 rows 0-1%): a language model's one-token generation
step feels it. Measured (docs/precisions.md): smollm2_135m, perplexity over 8 windows, channel
22.14 / auto 22.77 (141 of 211 weights one scale) / tensor 23.65 (204: all but the up
projections whose outlier columns are divided; quantize_dynamic 31.99); all_minilm_l6_v2
embedding cosine 0.9935 / 0.9934 (28 of 36) / 0.9858 (quantize_dynamic 0.9660)."""


def _weighted(m: Match, ctx: Context, k: int, n: int, gated: bool = False) -> Claim | Decline:
    problem = activation_problem(m, ctx, m.input(0))
    if problem:
        return Decline(problem)
    if m.input(0) in ctx.facts.gated_products and not gated:
        return Decline(
            f"its input {m.input(0)!r} is the product of two activations (a gated linear unit, "
            "as SwiGLU's down projection reads): their outliers multiply, and the one 8-bit "
            "scale the kernel computes per tensor at run time rounds most values to zero "
            "(smollm2_135m: perplexity 30.0 with these quantized, 20.3 without, float 19.1), "
            "so it stays float unless the two MatMuls that make the product are found "
            "(dynamic_gated_matmul then computes its outlier channels in float)"
        )
    small = small_decline(m.node.op_type, k, n, ctx)
    if small:
        return Decline(
            f"{small.reason} (onnxruntime's dynamic kernel quantizing its input at run time "
            "costs more than it saves on so small a weight)"
        )
    w = weight_spec(m, ctx, 1)
    if isinstance(w, Decline):
        return w
    if w.axis is not None and _one_scale(m, ctx, gated):
        w = replace(w, axis=None)
    return claim(activation(m, 0), w)


def _one_scale(m: Match, ctx: Context, gated: bool) -> bool:
    """Whether the kernel's weight gets one scale for the whole tensor
    (:data:`DYNAMIC_WEIGHT_SCALES`); never the up projection of a gated product whose outlier
    channels are split out: materialize divides those columns by a large factor, and only
    scales of their own keep their values."""
    mode = ctx.options.dynamic_weight_scales
    if mode == "channel" or (not gated and divided_columns(ctx.graph, m.node)):
        return False
    if mode == "tensor":
        return True
    w = ctx.graph.const_value(m.input(1))
    return w is not None and one_scale_sqnr_db(w, ctx.profile.weight_qmax) >= ONE_SCALE_SQNR_DB


def divided_columns(graph: ir.Graph, node: onnx.NodeProto) -> bool:
    """Whether ``node`` is the up projection (:func:`onnxq.place.rules.gated.linear_factor`) of
    a gated product whose down projection computes outlier channels in float: their weight
    columns in ``node`` are divided by ``onnxq.materialize.dynamic.OUTLIER_SHRINK``."""
    for product, _ in graph.consumers.get(node.output[0], []):
        for down, _ in graph.consumers.get(product.output[0], []):
            up = linear_factor(graph, down) if down.op_type == "MatMul" else None
            if up is not None and up.name == node.name:
                channels = outlier_channels(graph, down, GATED_OUTLIERS)
                if channels is not None and channels.size:
                    return True
    return False


@rule("dynamic_matmul", "MatMul")
def dynamic_matmul(m: Match, ctx: Context) -> Claim | Decline:
    """MatMul with a constant [K, N] weight -> DynamicQuantizeMatMul (per-column scales); a
    following bias Add is folded into the kernel."""
    b = ctx.graph.const_info(m.input(1))
    if b is None:
        return Decline("activation x activation MatMul (attention core) stays float")
    if b.ndim != 2:
        return Decline(
            f"its weight has rank {b.ndim}; onnxruntime's DynamicQuantizeMatMul takes a 2-D one"
        )
    taken = _weighted(m, ctx, int(b.shape[0]), int(b.shape[1]))
    add = bias_add(ctx.graph, m.node)
    if isinstance(taken, Decline) or add is None:
        return taken
    if ctx.options.node_excluded(add.name, add.op_type) or add.name in ctx.float_nodes:
        return taken
    return Claim(taken.specs, (add.name,), KERNEL_BIAS)


@rule("dynamic_gated_matmul", "MatMul")
def dynamic_gated_matmul(m: Match, ctx: Context) -> Claim | Decline:
    """MatMul reading a gated linear unit's output (SwiGLU's down projection) ->
    DynamicQuantizeMatMul of the product with its outlier channels (:data:`GATED_OUTLIERS`,
    found from the gate and up weights) zeroed, plus those channels' float MatMul."""
    b = ctx.graph.const_info(m.input(1))
    if m.input(0) not in ctx.facts.gated_products or b is None or b.ndim != 2:
        return Decline("not a MatMul with a constant 2-D weight reading a gated product")
    if outlier_channels(ctx.graph, m.node, GATED_OUTLIERS) is None:
        return Decline("the two MatMuls whose product it reads were not found")
    return _weighted(m, ctx, int(b.shape[0]), int(b.shape[1]), gated=True)


def bias_add(graph: ir.Graph, node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The one Add that reads a MatMul's output and a constant per-column vector (a Linear
    layer's bias, which exporters write as MatMul + Add), or None: DynamicQuantizeMatMul adds
    such a bias itself, one op fewer on every run."""
    out = node.output[0]
    readers = graph.consumers.get(out, [])
    if len(readers) != 1 or out in graph.graph_outputs:
        return None
    add, index = readers[0]
    if add.op_type != "Add" or add.domain not in ir.DEFAULT_DOMAINS or len(add.input) != 2:
        return None
    bias, weight = graph.const_info(add.input[1 - index]), graph.const_info(node.input[1])
    if bias is None or weight is None or bias.dtype != "float32":
        return None
    columns = weight.shape[-1:]
    return add if bias.shape[-1:] == columns and math.prod(bias.shape) == columns[0] else None


@rule("dynamic_gemm", "Gemm")
def dynamic_gemm(m: Match, ctx: Context) -> Claim | Decline:
    """Gemm with a constant B and a per-column (or no) C -> DynamicQuantizeMatMul."""
    attrs = m.attrs()
    b = ctx.graph.const_info(m.input(1))
    if b is None or b.ndim != 2:
        return Decline("B is not a constant matrix (activation x activation Gemm stays float)")
    if int(attrs.get("transA", 0)):  # type: ignore[call-overload]
        return Decline("transA=1: DynamicQuantizeMatMul reads A as it is, untransposed")
    trans_b = int(attrs.get("transB", 0))  # type: ignore[call-overload]
    k, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    c_name = m.input(2)
    if c_name:
        c = ctx.graph.const_info(c_name)
        size = None if c is None else math.prod(c.shape)
        if c is None or size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
            return Decline(
                "its C is not a constant per-column bias; DynamicQuantizeMatMul adds a 1-D "
                "bias only"
            )
    return _weighted(m, ctx, int(k), int(n))


@rule("dynamic_lstm", "LSTM")
def dynamic_lstm(m: Match, ctx: Context) -> Claim | Decline:
    """LSTM with constant W and R -> DynamicQuantizeLSTM (per-gate-row scales)."""
    if int(m.attrs().get("layout", 0)):  # type: ignore[call-overload]
        return Decline("layout=1 (batch first): onnxruntime's DynamicQuantizeLSTM takes layout 0")
    problem = activation_problem(m, ctx, m.input(0))
    if problem:
        return Decline(problem)
    specs = [activation(m, 0)]
    for index in (1, 2):
        info = ctx.graph.const_info(m.input(index))
        if info is None or info.ndim != 3 or info.dtype != "float32":
            return Decline(f"{'WR'[index - 1]} is not a constant float32 [dirs, 4*hidden, n]")
        specs.append(Spec(m.input(index), "weight", ((m.name, index),), axis=1))
    w = ctx.graph.const_info(m.input(1))
    assert w is not None
    small = small_decline("LSTM", int(w.shape[2]), int(w.shape[1]) // 4, ctx)
    if small:
        return Decline(
            f"{small.reason} (onnxruntime's DynamicQuantizeLSTM quantizing its input at run "
            "time costs more than it saves on so small a cell)"
        )
    return claim(*specs)
