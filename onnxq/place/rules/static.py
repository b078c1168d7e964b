"""Placement rules of static quantization for the activation-only ops (the rule sets in
``onnxq.place.rules.sets``; the weighted ops' rules: ``onnxq.place.rules.weighted``).

Each rule anchors on one op type family and says which of the node's tensors get Q/DQ.  Order
is priority: the first rule of a node's op type that does not decline claims the node.  What a
rule needs to know about the backend (weight axes, whether outputs are quantized, bias mode,
channel thresholds) comes from the profile, never from a branch on the backend's name.
"""

from __future__ import annotations

from onnxq.place.rules.cost import chain_decline
from onnxq.place.rules.kernel_limits import pool_overhang_decline
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Spec, claim, rule
from onnxq.place.rules.specs import activation, activation_problem, output_specs, quantized_output


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
