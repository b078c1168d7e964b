"""Tiny graphs for the accuracy-recovery tests: conv pairs (CLE), transformer blocks
(SmoothQuant), and their data.  Built with ``tests.graphs`` helpers; fixed names."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.graphs import init, model, rng, tensor, weight


def conv_act_conv(
    activation: str | None = "Relu",
    second_groups: int = 1,
    first_groups: int = 1,
    channels: int = 16,
    seed: int = 0,
) -> onnx.ModelProto:
    """``x -> conv1 (3x3, bias) -> activation -> conv2 -> y``; conv1's output channels have
    weights of very different magnitudes (what CLE evens out).  ``second_groups``:
    ``channels`` makes conv2 depthwise."""
    r = rng(seed)
    c_in = 8
    w1 = weight(r, channels, c_in // first_groups, 3, 3)
    w1 *= np.geomspace(0.02, 5.0, channels, dtype=np.float32)[:, None, None, None]
    b1 = weight(r, channels, scale=0.5)
    out2 = channels if second_groups == channels else 12
    w2 = weight(r, out2, channels // second_groups, 3, 3)
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "conv1.weight", "conv1.bias"],
            ["conv1_out"],
            name="conv1",
            pads=[1, 1, 1, 1],
            group=first_groups,
        )
    ]
    inits = [init("conv1.weight", w1), init("conv1.bias", b1), init("conv2.weight", w2)]
    between = "conv1_out"
    if activation is not None:
        between = "act_out"
        inputs, attrs = ["conv1_out"], {}
        if activation == "Clip":
            inputs += ["clip.min", "clip.max"]
            inits += [init("clip.min", np.float32(0.0)), init("clip.max", np.float32(6.0))]
        elif activation == "PRelu":
            inputs.append("prelu.slope")
            slope = (0.1 + 0.2 * r.random((channels, 1, 1))).astype(np.float32)
            inits.append(init("prelu.slope", slope))
        elif activation == "LeakyRelu":
            attrs["alpha"] = 0.1
        nodes.append(helper.make_node(activation, inputs, ["act_out"], name="act", **attrs))
    nodes.append(
        helper.make_node(
            "Conv",
            [between, "conv2.weight"],
            ["y"],
            name="conv2",
            pads=[1, 1, 1, 1],
            group=second_groups,
        )
    )
    return model(nodes, [tensor("x", [1, c_in, 10, 10])], [tensor("y", [1, out2, 10, 10])], inits)


def conv_chain(seed: int = 0) -> onnx.ModelProto:
    """Three convs with Relus between (two overlapping pairs), the last one depthwise."""
    r = rng(seed)
    w1 = weight(r, 16, 8, 3, 3) * np.geomspace(0.05, 4.0, 16, dtype=np.float32)[:, None, None, None]
    w2 = weight(r, 16, 16, 1, 1) * np.geomspace(3.0, 0.1, 16, dtype=np.float32)[:, None, None, None]
    w3 = weight(r, 16, 1, 3, 3)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1], group=16),
    ]
    inits = [
        init("w1", w1),
        init("b1", weight(r, 16)),
        init("w2", w2),
        init("b2", weight(r, 16)),
        init("w3", w3),
    ]
    return model(nodes, [tensor("x", [1, 8, 12, 12])], [tensor("y", [1, 16, 12, 12])], inits)


def outlier_batches(shape: list[int], n: int = 8, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Batches for input ``x`` whose last-axis channels 1 and 5 are 30x the others (the
    activation outliers SmoothQuant is for)."""
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = r.standard_normal(shape).astype(np.float32)
        x[..., 1] *= 30.0
        x[..., 5] *= 30.0
        out.append({"x": x})
    return out


def layernorm_block(residual: bool = False, k: int = 16, seed: int = 0) -> onnx.ModelProto:
    """``x -> LayerNormalization -> {MatMul q, MatMul v (+ bias)} -> Add -> MatMul out -> y``;
    ``residual``: the LayerNorm output is also added to ``y`` (a post-LN block), so it has a
    reader that is not a MatMul."""
    r = rng(seed)
    gamma = (1.0 + 0.1 * r.standard_normal(k)).astype(np.float32)
    gamma[3] = 8.0  # an outlier channel the norm's scale makes
    nodes = [
        helper.make_node(
            "LayerNormalization", ["x", "ln.scale", "ln.bias"], ["ln"], name="ln", axis=-1
        ),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["ln", "wv"], ["v0"], name="v_proj"),
        helper.make_node("Add", ["v0", "bv"], ["v"], name="v_bias"),
        helper.make_node("Add", ["q", "v"], ["qv"], name="join"),
        helper.make_node("MatMul", ["qv", "wo"], ["o"], name="o_proj"),
    ]
    if residual:
        nodes.append(helper.make_node("Add", ["o", "ln"], ["y"], name="residual"))
    else:
        nodes[-1].output[0] = "y"
    inits = [
        init("ln.scale", gamma),
        init("ln.bias", weight(r, k)),
        init("wq", weight(r, k, k)),
        init("wv", weight(r, k, k)),
        init("bv", weight(r, k)),
        init("wo", weight(r, k, k)),
    ]
    return model(nodes, [tensor("x", [2, 6, k])], [tensor("y", [2, 6, k])], inits)


def rmsnorm_swiglu(
    k: int = 16, hidden: int = 32, tokens: int = 6, seed: int = 0
) -> onnx.ModelProto:
    """A Llama MLP: ``Mul(gamma, x) -> gate, up; silu(gate) * up -> down -> y``."""
    r = rng(seed)
    gamma = (1.0 + 0.1 * r.standard_normal(k)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["gamma", "x"], ["normed"], name="rms_weight"),
        helper.make_node("MatMul", ["normed", "w_gate"], ["gate"], name="gate_proj"),
        helper.make_node("Sigmoid", ["gate"], ["gate_sig"], name="sigmoid"),
        helper.make_node("Mul", ["gate", "gate_sig"], ["silu"], name="silu"),
        helper.make_node("MatMul", ["normed", "w_up"], ["up"], name="up_proj"),
        helper.make_node("Mul", ["silu", "up"], ["prod"], name="swiglu"),
        helper.make_node("MatMul", ["prod", "w_down"], ["y"], name="down_proj"),
    ]
    inits = [
        init("gamma", gamma),
        init("w_gate", weight(r, k, hidden)),
        init("w_up", weight(r, k, hidden)),
        init("w_down", weight(r, hidden, k)),
    ]
    return model(nodes, [tensor("x", [2, tokens, k])], [tensor("y", [2, tokens, k])], inits)


def image_batches(
    m: onnx.ModelProto, n: int = 8, seed: int = 0, scale: float = 1.0
) -> list[dict[str, np.ndarray]]:
    """Random batches for a model with one static input."""
    r = np.random.default_rng(seed)
    vi = m.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return [{vi.name: (scale * r.standard_normal(shape)).astype(np.float32)} for _ in range(n)]


def placed(m, profile, cfg, batches, inputs):
    """The pipeline's placement and calibration of ``m`` (shapes inferred): (annotations,
    statistics)."""
    from onnxq import ir
    from onnxq.calibrate.measure import Calibration
    from onnxq.place.facts import GraphFacts
    from onnxq.place.loop import place

    facts = GraphFacts.of(ir.Graph(m), profile)
    measure = Calibration(m, batches, inputs, cfg.calibration, facts)
    placement = place(facts, profile, cfg.placement, measure)
    return placement.annotations, placement.statistics


def ranges_of(cfg, annotations):
    """Statistics -> ranges, as the pipeline turns them."""
    from onnxq.backends.profile import PROFILES
    from onnxq.calibrate.ranges import activation_ranges

    profile = PROFILES[cfg.backend]
    return lambda result: (
        activation_ranges(annotations, result.stats, profile, cfg.percentile).qparams
    )


def inverted_residual(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A stem conv (3x3, stride 2, ReLU6), then two MobileNetV2 blocks: expand 1x1 -> ReLU6 ->
    depthwise 3x3 -> ReLU6 -> project 1x1, the second with its residual Add; then a Sigmoid
    (an op no block holds) and one more 1x1 conv."""
    r = rng(seed)
    wide = 2 * channels
    inits = [init("clip.min", np.float32(0.0)), init("clip.max", np.float32(6.0))]
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "stem.w", "stem.b"],
            ["stem"],
            name="stem",
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        ),
        helper.make_node("Clip", ["stem", "clip.min", "clip.max"], ["s6"], name="stem_clip"),
    ]
    inits += [
        init("stem.w", weight(r, channels, 3, 3, 3, scale=0.4)),
        init("stem.b", weight(r, channels)),
    ]
    tail = "s6"
    for b in ("b1", "b2"):
        spread = np.geomspace(0.3, 3.0, wide, dtype=np.float32)[:, None, None, None]
        inits += [
            init(f"{b}.ew", weight(r, wide, channels, 1, 1, scale=0.3) * spread),
            init(f"{b}.eb", weight(r, wide)),
            init(f"{b}.dw", weight(r, wide, 1, 3, 3, scale=0.4)),
            init(f"{b}.db", weight(r, wide)),
            init(f"{b}.pw", weight(r, channels, wide, 1, 1, scale=0.2)),
            init(f"{b}.pb", weight(r, channels)),
        ]
        nodes += [
            helper.make_node("Conv", [tail, f"{b}.ew", f"{b}.eb"], [f"{b}.e"], name=f"{b}.expand"),
            helper.make_node(
                "Clip", [f"{b}.e", "clip.min", "clip.max"], [f"{b}.e6"], name=f"{b}.c1"
            ),
            helper.make_node(
                "Conv",
                [f"{b}.e6", f"{b}.dw", f"{b}.db"],
                [f"{b}.d"],
                name=f"{b}.depthwise",
                pads=[1, 1, 1, 1],
                group=wide,
            ),
            helper.make_node(
                "Clip", [f"{b}.d", "clip.min", "clip.max"], [f"{b}.d6"], name=f"{b}.c2"
            ),
            helper.make_node(
                "Conv", [f"{b}.d6", f"{b}.pw", f"{b}.pb"], [f"{b}.p"], name=f"{b}.project"
            ),
        ]
        if b == "b2":
            nodes.append(helper.make_node("Add", [f"{b}.p", tail], ["b2.out"], name="b2.add"))
            tail = "b2.out"
        else:
            tail = f"{b}.p"
    inits.append(init("head.w", weight(r, channels, channels, 1, 1, scale=0.3)))
    nodes += [
        helper.make_node("Sigmoid", [tail], ["sig"], name="sigmoid"),
        helper.make_node("Conv", ["sig", "head.w"], ["y"], name="head"),
    ]
    return model(nodes, [tensor("x", [1, 3, 16, 16])], [tensor("y", [1, channels, 8, 8])], inits)


def _relu6(source: str, output: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Clip", [source, "clip.min", "clip.max"], [output], name=name)
