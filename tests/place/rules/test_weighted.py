"""The weighted ops' placement rules (onnxq.place.rules.weighted): Conv, ConvTranspose, Gemm and
MatMul, each with a match test, a decline test (with its reason) and a Q/DQ count."""

from __future__ import annotations

import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.annotations import Excluded
from tests import graphs
from tests.place.rules.placed import (  # noqa: F401  (the fixture turns cost rules off)
    _onnxruntime_without_cost_rules,
    annotated,
    decision,
    kinds,
    qdq_counts,
)
from tests.placement import annotate_graph

# These tests check what each rule places once it applies, so the onnxruntime profile's cost
# rules are off here (tests/profiles.py).


# ------------------------------------------------------------------------------- conv
def test_conv_match_tensorrt_quantizes_input_and_weight_axis_0():
    ann = annotated(graphs.conv_relu())
    assert kinds(ann) == {"x": ("activation", None), "conv.weight": ("weight", 0)}
    assert ann.tensors["x"].consumers == [("conv", 0)]
    assert ann.tensors["conv.weight"].consumers == [("conv", 1)]
    d = decision(ann, "conv")
    assert d.quantized and d.rule == "conv" and d.tensors == ("x", "conv.weight")
    relu = decision(ann, "relu")
    assert not relu.quantized and "no tensorrt rule quantizes Relu" in relu.reason


def test_conv_match_onnxruntime_adds_int32_bias():
    ann = annotated(graphs.with_tail(graphs.conv_relu()), "onnxruntime")
    assert kinds(ann) == {
        "x": ("activation", None),
        "conv.weight": ("weight", 0),
        "conv.bias": ("bias", 0),
        "y": ("activation", None),  # the fused Relu's output
    }
    assert ann.tensors["conv.bias"].inputs == ("x", "conv.weight")


def test_conv_match_onnxruntime_quantizes_the_fused_relu_output():
    ann = annotated(graphs.residual_add(), "onnxruntime")
    relu = decision(ann, "relu1")
    assert relu.quantized and relu.rule == "fused" and "conv1" in relu.reason
    assert kinds(ann)["skip"] == ("activation", None)  # Relu's output, not the Conv's
    assert "conv1_out" not in ann.tensors


def test_conv_whose_output_cannot_be_quantized_stays_float_for_onnxruntime():
    d = decision(annotated(graphs.conv_relu(), "onnxruntime"), "conv")
    assert not d.quantized and d.reason.startswith(
        "its output 'y' is a graph output (never quantized), and onnxruntime has no integer "
        "Conv with a float output"
    )


def test_conv_transpose_stays_float_for_onnxruntime_which_has_no_integer_kernel_for_it():
    # onnxruntime 1.31's CPU provider leaves DQ -> ConvTranspose -> Q unfused; tensorrt runs it
    model = graphs.with_tail(graphs.conv_transpose_bn(group=1), "Relu")
    ort = decision(annotated(model, "onnxruntime"), "convt")
    assert not ort.quantized and ort.reason == (
        "onnxruntime has no integer ConvTranspose kernel: Q/DQ around it would only add work "
        "and rounding error"
    )
    assert decision(annotated(model, "tensorrt"), "convt").quantized


def test_a_conv_whose_output_stays_float_for_a_data_reason_gives_that_reason():
    graph = ir.Graph(ir.infer_shapes(graphs.with_tail(graphs.conv_relu())))
    ann = annotate_graph(
        graph,
        PROFILES["onnxruntime"],
        excluded=Excluded(tensors={"y": "tensor 'y' reaches |x| = 2e+05"}),
    )
    d = decision(ann, "conv")
    assert not d.quantized and d.reason.startswith(
        "tensor 'y' reaches |x| = 2e+05, and onnxruntime has no integer Conv"
    )


def test_relu_is_not_reported_fused_when_no_output_qdq_is_placed():
    # conv_relu's Relu output is the graph output, so no Q follows the Relu and onnxruntime
    # cannot fuse Conv+Relu into an integer kernel: the report must not call the Relu quantized.
    ann = annotated(graphs.conv_relu(), "onnxruntime")
    assert "y" not in ann.tensors
    relu = decision(ann, "relu")
    assert not relu.quantized, relu


def test_conv_transpose_match_weight_axis_1():
    ann = annotated(graphs.conv_transpose())
    assert kinds(ann)["convt.weight"] == ("weight", 1)
    assert decision(ann, "convt").rule == "conv"


@pytest.mark.parametrize("spread, quantized", [(4.0, True), (100.0, False)])
def test_a_depthwise_conv_transpose_whose_kernels_share_one_scale(spread, quantized):
    # [C_in, K/g, kh, kw] with K/g = 1: TensorRT's weight axis 1 holds one scale for all 16
    # kernels; kernels 100x apart (a folded BatchNormalization) would round the small ones to 0
    model = graphs.conv_transpose(channels=16, out_channels=16, group=16)
    w = next(t for t in model.graph.initializer if t.name == "convt.weight")
    values = onnx.numpy_helper.to_array(w).copy()
    values[::2] /= spread
    w.CopyFrom(onnx.numpy_helper.from_array(values, "convt.weight"))
    d = decision(annotated(model), "convt")
    assert d.quantized is quantized, d.reason
    if not quantized:
        assert "shares each scale across the 16 groups" in d.reason
        assert "(> 16x)" in d.reason


def test_conv_decline_small_channels():
    ann = annotated(graphs.conv_small())
    d = decision(ann, "conv")
    assert not d.quantized and d.rule == "conv"
    assert "Conv with 3 input / 16 output channels" in d.reason
    assert "min_channels=16" in d.reason and "27 products per output, fewer than 128" in d.reason
    assert ann.tensors == {}


def test_conv_small_is_quantized_when_min_channels_is_disabled():
    ann = annotated(graphs.conv_small(), min_channels=0)
    assert decision(ann, "conv").quantized
    assert kinds(ann)["conv.weight"] == ("weight", 0)


def test_conv_decline_non_constant_weight():
    d = decision(annotated(graphs.conv_dynamic_weight()), "conv")
    assert not d.quantized
    assert d.reason == "weight 'w' is not a constant of rank >= 3"


def test_grouped_conv_decline_small_kernel_and_match_3x3():
    d = decision(annotated(graphs.grouped_conv(kernel=1)), "conv")
    assert not d.quantized and "grouped conv (group=2)" in d.reason and "kernel 1" in d.reason
    ann = annotated(graphs.grouped_conv(kernel=3))
    assert decision(ann, "conv").quantized
    assert kinds(ann)["conv.weight"] == ("weight", 0)


def test_the_grouped_conv_figures_are_the_profiles():
    graph = ir.Graph(ir.infer_shapes(graphs.grouped_conv(kernel=3)))
    strict = PROFILES["tensorrt"].replace(grouped_min_kernel=5, grouped_channel_multiple=32)
    d = decision(annotate_graph(graph, strict, QuantConfig()), "conv")
    assert not d.quantized and d.reason.endswith(
        "INT8 pays only when out_channels % 32 == 0 and kernel >= 5"
    )
    lenient = PROFILES["tensorrt"].replace(grouped_min_kernel=1)
    graph = ir.Graph(ir.infer_shapes(graphs.grouped_conv(kernel=1)))
    assert decision(annotate_graph(graph, lenient, QuantConfig()), "conv").quantized


@pytest.mark.parametrize(
    ("builder", "backend", "expected"),
    [
        (graphs.conv_relu, "tensorrt", (1, 2)),
        (graphs.conv_relu, "onnxruntime", (0, 0)),  # output is the graph output: stays float
        (lambda: graphs.with_tail(graphs.conv_relu()), "onnxruntime", (2, 4)),  # + bias, + out
        (graphs.conv_small, "tensorrt", (0, 0)),
        (graphs.conv_transpose, "tensorrt", (1, 2)),
        # onnxruntime's CPU provider has no integer ConvTranspose: it stays float
        (lambda: graphs.with_tail(graphs.conv_transpose()), "onnxruntime", (0, 0)),
    ],
)
def test_conv_qdq_count(builder, backend, expected):
    assert qdq_counts(builder(), backend) == expected


def test_conv_qdq_wiring_tensorrt():
    model = graphs.conv_relu()
    out = onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).model
    g = ir.Graph(out)
    conv = g.node_by_name("conv")
    act_dq = g.producer[conv.input[0]]
    assert act_dq.op_type == "DequantizeLinear"
    act_q = g.producer[act_dq.input[0]]
    assert act_q.op_type == "QuantizeLinear" and act_q.input[0] == "x"
    w_dq = g.producer[conv.input[1]]
    assert w_dq.op_type == "DequantizeLinear"
    assert g.const_value(w_dq.input[0]).dtype.name == "int8"
    # TensorRT keeps a float bias: a constant the Conv reads (no DequantizeLinear of int32),
    # the float model's, in the type the Conv computes in (FP16 in the default output)
    bias = g.const_value(conv.input[2])
    assert conv.input[2] not in g.producer and bias is not None and bias.dtype.kind == "f"
    want = ir.Graph(model).const_value("conv.bias")
    assert want is not None and (bias == want.astype(bias.dtype)).all()


# ------------------------------------------------------------------------------- gemm
@pytest.mark.parametrize(("trans_b", "axis"), [(True, 0), (False, 1)])
def test_gemm_match_weight_axis_follows_transb(trans_b, axis):
    ann = annotated(graphs.gemm(trans_b=trans_b))
    assert kinds(ann) == {"x": ("activation", None), "gemm.weight": ("weight", axis)}
    assert decision(ann, "gemm").rule == "gemm"


def test_gemm_decline_non_constant_b():
    d = decision(annotated(graphs.gemm_act()), "gemm")
    assert not d.quantized and d.rule == "gemm"
    assert "B is not a constant matrix" in d.reason


def test_gemm_decline_small_output():
    d = decision(annotated(graphs.gemm(n=8)), "gemm")
    assert not d.quantized and "32 input / 8 output channels" in d.reason


@pytest.mark.parametrize(
    ("trans_b", "backend", "expected"),
    [
        (True, "tensorrt", (1, 2)),
        (False, "tensorrt", (1, 2)),
        (True, "onnxruntime", (1, 3)),
        (False, "onnxruntime", (1, 3)),
    ],
)
def test_gemm_qdq_count(trans_b, backend, expected):
    assert qdq_counts(graphs.gemm(trans_b=trans_b), backend) == expected


# ------------------------------------------------------------------------------- matmul
def test_matmul_match_const_kn_weight_axis_1():
    ann = annotated(graphs.matmul_const())
    assert kinds(ann) == {"x": ("activation", None), "matmul.weight": ("weight", 1)}


def test_matmul_decline_activation_times_activation():
    d = decision(annotated(graphs.matmul_act()), "matmul")
    assert not d.quantized and d.rule == "matmul"
    assert "activation x activation MatMul" in d.reason


def test_matmul_decline_vector_right_hand_side():
    d = decision(annotated(graphs.matmul_vector()), "matmul")
    assert not d.quantized and "GEMV" in d.reason


@pytest.mark.parametrize(
    ("builder", "backend", "expected"),
    [
        (graphs.matmul_const, "tensorrt", (1, 2)),
        # float output (the Relu after it is a graph output): MatMulIntegerToFloat
        (graphs.matmul_const, "onnxruntime", (1, 2)),
        (lambda: graphs.with_tail(graphs.matmul_const()), "onnxruntime", (2, 3)),
        (graphs.matmul_act, "tensorrt", (0, 0)),
        (graphs.matmul_act, "onnxruntime", (0, 0)),
    ],
)
def test_matmul_qdq_count(builder, backend, expected):
    assert qdq_counts(builder(), backend) == expected
