"""Which Q/DQ groups onnxruntime fuses into integer kernels (onnxq check, onnxruntime)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import onnxq
from onnxq.backends.fusion import fusion_report
from onnxq.backends.profile import PROFILES
from tests import graphs

KERNELS = PROFILES["onnxruntime"].integer_kernel_ops


def _qdq(name: str, src: str, scale: str = "s", zp: str = "zp") -> list[onnx.NodeProto]:
    return [
        helper.make_node("QuantizeLinear", [src, scale, zp], [f"{name}_q"], name=f"{name}_Q"),
        helper.make_node(
            "DequantizeLinear", [f"{name}_q", scale, zp], [f"{name}_dq"], name=f"{name}_DQ"
        ),
    ]


def _swish_model(with_float_input: bool) -> onnx.ModelProto:
    """x -> Q/DQ -> Mul(dq, Sigmoid(dq) or a second Q/DQ of it) -> Q/DQ -> y."""
    nodes = _qdq("x", "x")
    nodes.append(helper.make_node("Sigmoid", ["x_dq"], ["sig"], name="sigmoid"))
    if with_float_input:
        other = "sig"
    else:
        nodes += _qdq("sig", "sig")
        other = "sig_dq"
    nodes.append(helper.make_node("Mul", ["x_dq", other], ["m"], name="mul"))
    nodes += _qdq("m", "m")
    nodes.append(helper.make_node("Identity", ["m_dq"], ["y"], name="out"))
    inits = [
        numpy_helper.from_array(np.float32(0.05), "s"),
        numpy_helper.from_array(np.uint8(128), "zp"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, 8, 4, 4])],
        [graphs.tensor("y", [1, 8, 4, 4])],
        inits,
        name="swish",
    )


def test_a_mul_with_every_input_dequantized_is_a_group_and_fuses():
    report = fusion_report(_swish_model(with_float_input=False), KERNELS)
    assert report.candidates == ("sigmoid", "mul") and report.unfused == ()
    assert not report.float_inputs
    assert report.integer_ops.get("QLinearMul") == 1


def test_a_mul_reading_a_float_input_is_not_counted_as_an_unfused_group():
    # x * Sigmoid(x) with x dequantized and Sigmoid's output float: onnxruntime cannot fuse it,
    # and it is not a Q/DQ group: listed apart, not as "not fused"
    report = fusion_report(_swish_model(with_float_input=True), KERNELS)
    assert report.candidates == () and report.unfused == () and report.ratio == 1.0
    assert report.float_inputs == (("mul", "Mul"),)


def test_an_onnxq_output_fuses_every_conv_group():
    # the final Add reads two dequantized tensors but writes the float graph output: no group
    model = graphs.residual_add(channels=32)
    out = onnxq.quantize(
        model, graphs.random_batches(model, 3), backend="onnxruntime", progress=False
    ).model
    report = fusion_report(out, KERNELS)
    assert report.candidates == ("conv1", "conv2") and report.ratio == 1.0
    assert report.integer_ops == {"QLinearConv": 2}


def test_a_conv_that_became_a_float_fusedconv_counts_as_unfused():
    # tensorrt's placement (Q/DQ on the conv's input and weight only): onnxruntime fuses Conv +
    # Relu into a float FusedConv that still reads the DequantizeLinear
    model = graphs.conv_relu(channels=32, out_channels=32, size=16)
    out = onnxq.quantize(
        model, graphs.random_batches(model, 3), backend="tensorrt", progress=False
    ).model
    report = fusion_report(out, KERNELS)
    assert report.candidates == ("conv",) and report.unfused == (("conv", "Conv"),)


def test_an_add_whose_relu_folds_into_the_q_after_it_is_a_group():
    # Add -> Relu -> Q: onnxruntime folds the Relu into the Q and runs QLinearAdd; the group
    # must be counted (and so checked), as the kernel list shows it
    nodes = _qdq("a", "a") + _qdq("b", "b")
    nodes.append(helper.make_node("Add", ["a_dq", "b_dq"], ["sum"], name="add"))
    nodes.append(helper.make_node("Relu", ["sum"], ["r"], name="relu"))
    nodes += _qdq("r", "r", zp="zp0")  # zero point 0: the Relu adds nothing to the Q
    nodes.append(helper.make_node("Identity", ["r_dq"], ["y"], name="out"))
    inits = [
        numpy_helper.from_array(np.float32(0.05), "s"),
        numpy_helper.from_array(np.uint8(128), "zp"),
        numpy_helper.from_array(np.uint8(0), "zp0"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor(n, [1, 8, 4, 4]) for n in ("a", "b")],
        [graphs.tensor("y", [1, 8, 4, 4])],
        inits,
        name="add_relu",
    )
    report = fusion_report(model, KERNELS, PROFILES["onnxruntime"].folded_activations)
    assert report.candidates == ("add",) and report.unfused == ()
    assert report.integer_ops == {"QLinearAdd": 1}
    # without folding, the Add writes a float tensor: not a group
    assert fusion_report(model, KERNELS).candidates == ()


def test_a_bias_read_through_an_identity_of_an_initializer_is_a_constant():
    # without simplify, the legacy exporter's Identity copies of a bias stay; onnxruntime folds
    # them, and both Gemms are groups (the count said "0 of 0 groups ... QGemm x1")
    from tests.test_ir import _shared_bias_gemms

    model = _shared_bias_gemms(identity=True)
    out = onnxq.quantize(
        model,
        graphs.random_batches(model, 3),
        backend="onnxruntime",
        simplify=False,
        progress=False,
    ).model
    report = fusion_report(out, KERNELS)
    assert not report.float_inputs and report.candidates == ("fc1", "fc2")
    assert report.integer_ops == {"QGemm": len(report.candidates) - len(report.unfused)}


def test_an_unfused_group_that_shares_a_bias_dequantize_says_so(monkeypatch):
    # as onnxq wrote before it unshared biases again after simplify: the torch exporter's
    # Identity copies of one zero bias, which onnxruntime leaves unfused for every conv after
    # the first (any other bias value is a bias-scale violation, which quantize refuses)
    r = graphs.rng(2)
    nodes = [helper.make_node("Identity", ["b"], [f"b{i}"], name=f"copy{i}") for i in (1, 2)]
    nodes += [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Identity", ["r2"], ["y"], name="out"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", [1, 16, 8, 8])],
        [graphs.tensor("y", [1, 16, 8, 8])],
        [
            graphs.init("w1", graphs.weight(r, 16, 16, 3, 3)),
            graphs.init("w2", graphs.weight(r, 16, 16, 3, 3, scale=0.6)),
            graphs.init("b", np.zeros(16, np.float32)),
        ],
    )
    monkeypatch.setattr("onnxq.prepare.simplify.ir.unshare_biases", lambda graph: 0)
    out = onnxq.quantize(
        model, graphs.random_batches(model, 3), backend="onnxruntime", progress=False
    ).model
    report = fusion_report(out, KERNELS)
    assert report.unfused == (("conv2", "Conv"),)
    assert report.reasons["conv2"].startswith(
        "its input 2 (b_DequantizeLinear) also feeds 1 other node(s), e.g. conv1"
    )
