"""When an integer kernel pays for itself: the cost side of placement, for rules to consult.

An int8 kernel replaces a float one, and every edge between an int8 op and a float op costs a
QuantizeLinear or a DequantizeLinear (a full pass over the tensor).  Measured with onnxruntime
1.31 on a Xeon that reports AVX-512, VNNI and AMX-INT8, one thread (``git: docs/benchmarks.md``,
Latency).  The thresholds are per CPU class: the profile takes them from the target class's
cost table (``onnxq.backends.cost_tables``; ``onnxq tune-cpu`` measures one), and the shipped
tables all hold that CPU's values:

* QLinearConv beats the float Conv only when each output sums enough products: a C -> C 1x1
  conv runs at 0.7x float speed with C = 16, 1.1x with 32, 2x with 88, 3.4x with 576; a
  depthwise conv (9 or 25 products per output) at 0.1-0.7x; the 3-channel first conv of an image
  model at about 0.5x.  A Q+DQ pair costs about 0.3 ns per element, three float ReLUs.
* An op of a few thousand multiply-adds (a squeeze-and-excitation conv on a 1x1 map, a 256x4
  head) takes microseconds either way; the Q/DQ nodes around it cost more than it saves.
* QLinearAdd/QLinearMul/QLinearConcat/QLinearGlobalAveragePool save nothing over the float op
  by themselves: they pay only by keeping a chain of integer kernels unbroken.

So the profile names ``float_grouped_convs``, ``min_macs_per_output``, ``min_macs`` and
``chain_ops``.  A weighted op that falls under them still gets int8 inside a chain: its input
comes quantized out of an integer kernel and one of its readers can continue the chain (int8
then saves a DequantizeLinear instead of adding a QuantizeLinear).  A chain op gets int8 when
every activation input comes out of an integer kernel.  Two consequences: onnxruntime never
fuses a float conv on its own (it quantizes the weights of a Conv between a DQ and a Q, per
tensor), because no Q follows a declined conv; and a conv whose output reaches a MaxPool keeps
int8 (``nhwc_only_ops``, see :func:`_reaches_nhwc_only_op`).
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from onnxq.place.rules.pattern import Context, Decline, Match


def from_integer_kernel(ctx: Context, tensor: str) -> bool:
    """True if ``tensor`` is quantized as the output of an op already placed in int8."""
    producer = ctx.graph.producer.get(tensor)
    return (
        producer is not None
        and producer.name in ctx.claimed
        and ctx.quantized.get(tensor) in ("activation", "shared")
    )


def macs_per_sample(ctx: Context, output: str, macs_per_output: int) -> int | None:
    """Multiply-adds of one sample (the output's first axis is the batch), if shapes are static."""
    shape = ctx.graph.shape(output)
    if shape is None or not shape or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    return math.prod(shape[1:]) * macs_per_output  # type: ignore[arg-type]


def _continues_chain(ctx: Context, tensor: str) -> bool:
    """True if some reader of ``tensor`` (past a folded ReLU/Clip) can run as an integer kernel:
    an op that has one and whose other activation inputs all come from ops that have one too."""
    g = ctx.graph
    kernels = ctx.profile.integer_kernel_ops
    readers = g.consumers.get(tensor, [])
    if len(readers) == 1 and readers[0][0].op_type in ctx.profile.folded_activations:
        tensor = readers[0][0].output[0]  # a ReLU/Clip the output quantization absorbs
        readers = g.consumers.get(tensor, [])
    for node, _ in readers:
        if node.op_type not in kernels or node.name in ctx.float_nodes:
            continue  # (a node the calibration data keeps float continues nothing)
        others = [t for t in node.input if t and t != tensor and not g.is_const(t)]
        if all((p := g.producer.get(t)) is not None and p.op_type in kernels for t in others):
            return True
    return False


def _reaches_nhwc_only_op(ctx: Context, tensor: str, depth: int = 6) -> bool:
    """True if ``tensor`` flows, through at most ``depth`` ops without weights, into one of the
    profile's ``nhwc_only_ops`` whose output may be quantized (:func:`_may_be_quantized`).

    onnxruntime moves a QuantizeLinear backward through MaxPool, so a float op -> MaxPool -> Q
    runs the pool on uint8; outside the NHWC layout of its integer convs that kernel is 10x
    slower than the float pool (MTCNN R-Net: 74 us against 6 us).  Keeping the conv before it
    in int8 keeps the pool in that layout.  When no op after the pool takes int8 on its own
    (MTCNN P-Net's 10-channel conv), no Q follows the pool and the conv stays float.
    """
    g = ctx.graph
    frontier, seen = [(tensor, 0)], set()
    while frontier:
        t, steps = frontier.pop()
        if t in seen or steps >= depth or t in g.graph_outputs:
            continue
        seen.add(t)
        for node, _ in g.consumers.get(t, []):
            if node.op_type in ctx.profile.nhwc_only_ops:
                if _may_be_quantized(ctx, node):
                    return True
            elif node.op_type not in ctx.profile.weight_axes:
                frontier.extend((o, steps + 1) for o in node.output if o)
    return False


def _may_be_quantized(ctx: Context, pool: onnx.NodeProto, depth: int = 3) -> bool:
    """False only when ``pool``'s output certainly stays float: no other reader of its input
    takes int8 by itself (:func:`_pays_alone`; the input would be quantized anyway), and every
    reader of its output, through at most ``depth`` passthrough ops, is an op without an integer
    kernel or a weighted op that does not take int8 by itself."""
    g, p = ctx.graph, ctx.profile
    if any(r is not pool and _pays_alone(ctx, r) for r, _ in g.consumers.get(pool.input[0], [])):
        return True
    frontier = [(pool.output[0], 0)]
    while frontier:
        t, steps = frontier.pop()
        if t in g.graph_outputs:
            continue
        for node, _ in g.consumers.get(t, []):
            if kernel_terms(ctx, node) is not None:
                if _pays_alone(ctx, node):
                    return True
            elif node.op_type in p.passthrough_ops:
                if steps + 1 >= depth:
                    return True  # too far to tell
                frontier.extend((o, steps + 1) for o in node.output[:1] if o)
            elif node.op_type in p.integer_kernel_ops:
                return True  # a Concat, Add, ... that may take int8
    return False


def chain_decline(m: Match, ctx: Context, inputs: list[str]) -> Decline | None:
    """For a profile chain op: decline unless every activation input comes out of an int8 op
    and some reader of its output can go on in int8."""
    if m.node.op_type not in ctx.profile.chain_ops:
        return None
    if not all(from_integer_kernel(ctx, t) for t in inputs):
        return Decline(
            f"{ctx.profile.name}'s integer {m.node.op_type} pays only inside a chain of integer "
            "kernels, and not every input comes quantized out of one: Q/DQ around it would "
            "cost more than it saves, it stays float"
        )
    if not _continues_chain(ctx, m.node.output[0]):
        # the chain ends here: its output is dequantized at once, so int8 saves nothing and
        # adds a rounding, often of a model's final scores (a detector's objectness Sigmoid)
        return Decline(
            f"{ctx.profile.name}'s integer {m.node.op_type} pays only inside a chain of integer "
            "kernels, and no reader of its output continues one: it stays float"
        )
    return None


def _cost_reason(
    ctx: Context, output: str, macs_per_output: int, grouped: bool, unaligned: bool
) -> str | None:
    """Why the profile's cost thresholds say int8 loses for this op by itself, or None."""
    p = ctx.profile
    if grouped and p.float_grouped_convs:
        return f"a grouped conv: {p.name}'s int8 grouped/depthwise kernel is slower than float"
    if p.min_macs_per_output and macs_per_output < p.min_macs_per_output:
        return (
            f"{macs_per_output} multiply-adds per output element (< min_macs_per_output="
            f"{p.min_macs_per_output}): {p.name}'s int8 kernel is slower than float here"
        )
    if unaligned and macs_per_output < p.min_macs_per_output_unaligned:
        return (
            f"{macs_per_output} multiply-adds per output element over input channels that "
            f"are not a multiple of {p.channel_alignment} (< min_macs_per_output_unaligned="
            f"{p.min_macs_per_output_unaligned}): {p.name}'s int8 kernel is slower than "
            "float here"
        )
    if (
        p.min_macs
        and (macs := macs_per_sample(ctx, output, macs_per_output)) is not None
        and macs < p.min_macs
    ):
        return (
            f"{macs} multiply-adds per sample (< min_macs={p.min_macs}): too small to pay "
            "for the Q/DQ around it"
        )
    return None


def kernel_terms(ctx: Context, node: onnx.NodeProto) -> tuple[int, bool, bool] | None:
    """(products summed per output element, grouped, unaligned) of a Conv/Gemm/MatMul with a
    constant weight; None for anything else.  ``unaligned``: a conv with a kernel larger than
    1x1 whose input channels per group are not a multiple of the profile's
    ``channel_alignment``."""
    w = ctx.graph.const_info(node.input[1]) if len(node.input) > 1 else None
    if w is None or w.ndim < 2:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv" and w.ndim >= 3:
        area, align = math.prod(w.shape[2:]), ctx.profile.channel_alignment
        return (
            int(w.shape[1] * area),
            int(attrs.get("group", 1)) > 1,
            area > 1 and align > 0 and w.shape[1] % align != 0,
        )
    if node.op_type == "Gemm" and w.ndim == 2:
        return int(w.shape[1] if attrs.get("transB", 0) else w.shape[0]), False, False
    if node.op_type == "MatMul":
        return int(w.shape[-2]), False, False
    return None


def _pays_alone(ctx: Context, node: onnx.NodeProto) -> bool:
    """True if ``node`` is a Conv/Gemm/MatMul that the cost thresholds give int8 by itself."""
    terms = kernel_terms(ctx, node)
    return terms is not None and _cost_reason(ctx, node.output[0], *terms) is None


def cost_decline(
    m: Match, ctx: Context, macs_per_output: int, grouped: bool = False, unaligned: bool = False
) -> Decline | None:
    """For Conv/Gemm/MatMul: decline when the profile's cost rules say int8 loses here.

    ``macs_per_output`` is the number of products summed into each output element; ``grouped``
    says the op is a grouped (depthwise) conv, ``unaligned`` a spatial conv over input channels
    that are not a multiple of the profile's ``channel_alignment``.  Such
    an op gets int8 only when its
    input comes quantized out of an integer kernel.
    """
    why = _cost_reason(ctx, m.node.output[0], macs_per_output, grouped, unaligned)
    if why is None:
        return None
    if _reaches_nhwc_only_op(ctx, m.node.output[0]):
        return None
    if not from_integer_kernel(ctx, m.input(0)):
        return Decline(
            f"{why}, and its input does not come quantized out of an integer kernel; it stays float"
        )
    if not _continues_chain(ctx, m.node.output[0]):
        return Decline(
            f"{why}, and no reader continues the chain of integer kernels (the "
            "DequantizeLinear goes on its input instead); it stays float"
        )
    return None
