"""FP8 conv limits (ModelOpt's FP8 placement): small-channel and large-filter convs stay float.
The small-op rule's exception for Convs with a long reduction (``long_conv_reduction``)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.profile import TENSORRT
from onnxq.config import QuantConfig
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.kernel_limits import (
    conv_kernel_decline,
    conv_reduction,
    long_reduction,
    pool_overhang_decline,
)
from tests import graphs

FP8 = QuantConfig(precision="fp8").backend_profile()[0]


def conv(out_c: int, in_c: int, kernel: int):
    r = graphs.rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv_out"], name="conv"),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, in_c, 16, 16])],
        [graphs.tensor("y", [1, out_c, 16 - kernel + 1, 16 - kernel + 1])],
        [graphs.init("w", graphs.weight(r, out_c, in_c, kernel, kernel))],
    )


def conv1d(out_c: int, in_c: int, kernel: int, stride: int = 1, group: int = 1, length: int = 512):
    """x [1, in_c, length] -> Conv1d -> Relu -> y (an STFT's basis conv, a 1x1 output conv)."""
    r = graphs.rng(0)
    nodes = [
        helper.make_node(
            "Conv", ["x", "w"], ["conv_out"], name="conv", strides=[stride], group=group
        ),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    steps = (length - kernel) // stride + 1
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, in_c, length])],
        [graphs.tensor("y", [1, out_c, steps])],
        [graphs.init("w", graphs.weight(r, out_c, in_c // group, kernel))],
    )


def decision(model, profile, **options):
    graph = ir.Graph(ir.infer_shapes(model))
    config = QuantConfig(precision="fp8" if profile is FP8 else "int8", **options)
    ann = annotate(GraphFacts.of(graph, profile), profile, config.placement)
    return next(d for d in ann.decisions if d.node == "conv")


def test_a_32_channel_3x3_conv_gets_fp8():
    assert decision(conv(32, 32, 3), FP8).quantized


@pytest.mark.parametrize(("out_c", "in_c"), [(16, 32), (32, 16)])
def test_a_conv_with_16_channels_stays_float_in_fp8_but_not_in_int8(out_c, in_c):
    d = decision(conv(out_c, in_c, 3), FP8)
    assert not d.quantized and "<= 16 on either side" in d.reason
    assert decision(conv(out_c, in_c, 3), TENSORRT).quantized


def test_a_7x7_filter_stays_float_in_fp8():
    d = decision(conv(32, 32, 7), FP8)
    assert not d.quantized and "49 elements per channel (> 32)" in d.reason
    assert decision(conv(32, 32, 7), TENSORRT).quantized


def test_no_limit_on_a_profile_without_them():
    assert conv_kernel_decline(TENSORRT, (4, 4, 9, 9)) is None


# ------------------------------------------------------------------ long_conv_reduction (INT8)
def test_a_conv_reduction_is_input_channels_per_group_times_kernel_area():
    assert conv_reduction((258, 1, 256)) == 256
    assert conv_reduction((16, 3, 3, 3)) == 27
    assert conv_reduction((32, 1, 3, 3)) == 9  # depthwise: one channel per group


@pytest.mark.parametrize(
    ("out_c", "in_c", "kernel", "stride"),
    [(258, 1, 256, 128), (130, 1, 128, 64), (1, 128, 1, 1)],
    ids=["stft-16k", "stft-8k", "128-to-1"],
)
def test_a_conv_summing_128_products_per_output_gets_int8_whatever_its_channels(
    out_c, in_c, kernel, stride
):
    model = conv1d(out_c, in_c, kernel, stride)
    assert TENSORRT.long_conv_reduction == 128 and TENSORRT.min_channels == 16
    assert decision(model, TENSORRT).quantized


@pytest.mark.parametrize(
    ("model", "channels", "products"),
    [
        (conv1d(1, 127, 1), "127 input / 1 output channels", 127),
        (conv1d(258, 1, 127, 64), "1 input / 258 output channels", 127),
        (conv(16, 3, 3), "3 input / 16 output channels", 27),  # an RGB stem
        (conv(16, 1, 3), "1 input / 16 output channels", 9),
        (conv(4, 32, 1), "32 input / 4 output channels", 32),  # a box head
    ],
    ids=["127-to-1", "stft-127-taps", "rgb-3x3", "gray-3x3", "32-to-4"],
)
def test_a_small_conv_summing_fewer_products_stays_float(model, channels, products):
    d = decision(model, TENSORRT)
    assert not d.quantized
    assert d.reason.startswith(
        f"Conv with {channels} (min_channels=16: fewer than 16 on either side, and {products} "
        "products per output, fewer than 128): INT8 does not pay for it"
    )


def test_the_exception_is_for_group_1_convs_only():
    # 256 channels in 128 groups of 2, 64 taps: K = 128, but out_channels 8 < 16
    model = conv1d(8, 256, 64, group=128)
    assert long_reduction(TENSORRT, (8, 2, 64), 128) is None
    d = decision(model, TENSORRT)
    assert not d.quantized and "products per output" not in d.reason


def test_the_exception_follows_the_small_op_rule_the_config_sets():
    stft = conv1d(258, 1, 256, 128)
    assert decision(stft, TENSORRT, min_channels=64).quantized  # still a long reduction
    assert decision(conv(16, 3, 3), TENSORRT, min_channels=0).quantized  # rule off
    assert long_reduction(TENSORRT.replace(long_conv_reduction=0), (258, 1, 256), 1) is None
    d = decision(stft, TENSORRT.replace(long_conv_reduction=0))
    assert not d.quantized and "products per output" not in d.reason


def test_an_stft_conv_quantized_for_tensorrt_stays_close_to_float_in_onnxruntime():
    model = conv1d(258, 1, 256, 128, length=640)
    batches = graphs.random_batches(model, 4)
    result = onnxq.quantize(model, batches, backend="tensorrt", progress=False)
    out = result.model
    assert sum(n.op_type == "DequantizeLinear" for n in out.graph.node) == 2  # input and weight
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sessions = [
        ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for m in (model, out)
    ]
    x = graphs.random_batches(model, 1, seed=7)[0]
    f, q = (s.run(None, x)[0].ravel().astype(np.float64) for s in sessions)
    assert np.dot(f, q) / (np.linalg.norm(f) * np.linalg.norm(q)) > 0.999


# ------------------------------------------- AveragePool with ceil_mode and count_include_pad
def silu_pool_head(kernel: int, stride: int, spatial: int = 7, seed: int = 0):
    """x -> Conv 3x3 -> SiLU (x * Sigmoid) -> AveragePool(ceil_mode=1, count_include_pad=1)
    -> Reshape -> Gemm -> y: the tail of HF EfficientNet, whose pooler is
    ``nn.AvgPool2d(hidden_dim, ceil_mode=True)``."""
    r = graphs.rng(seed)
    out = -(-(spatial - kernel) // stride) + 1 if spatial >= kernel else 1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["conv_out"], ["gate"], name="sigmoid"),
        helper.make_node("Mul", ["conv_out", "gate"], ["silu"], name="silu"),
        helper.make_node(
            "AveragePool",
            ["silu"],
            ["pooled"],
            name="pool",
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            ceil_mode=1,
            count_include_pad=1,
        ),
        helper.make_node("Reshape", ["pooled", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["y"], name="fc", transB=1),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, 32, spatial, spatial])],
        [graphs.tensor("y", [1, 128])],
        [
            graphs.init("w", graphs.weight(r, 32, 32, 3, 3)),
            graphs.init("b", graphs.weight(r, 32)),
            graphs.init("fc", graphs.weight(r, 128, 32 * out * out)),
            graphs.init("fc_b", graphs.weight(r, 128)),
            graphs.init("flat_shape", np.array([-1, 32 * out * out], dtype=np.int64)),
        ],
    )


@pytest.mark.parametrize(("kernel", "stride"), [(2, 2), (16, 16)])
def test_an_average_pool_whose_ceil_window_overhangs_stays_float_for_onnxruntime(kernel, stride):
    # onnxruntime's QLinearAveragePool divides the overhanging window by the whole kernel:
    # quantized, HF EfficientNet's pooler gave cosine 0.11 against float
    m = silu_pool_head(kernel, stride)
    batches = graphs.random_batches(m, 8)
    result = onnxq.quantize(m, batches, backend="onnxruntime")
    session = ort.InferenceSession(
        result.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    reference = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in batches:
        got, want = session.run(None, batch)[0].ravel(), reference.run(None, batch)[0].ravel()
        cosine = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.99
    (pool,) = [d for d in result.report.float_ops if d.node == "pool"]
    assert "ceil_mode=1 and count_include_pad=1" in pool.reason


def test_an_average_pool_whose_windows_fit_is_quantized_for_onnxruntime():
    # 8x8 input, 2x2 windows of stride 2: ceil mode adds nothing, the integer kernel is exact
    m = silu_pool_head(2, 2, spatial=8)
    result = onnxq.quantize(m, graphs.random_batches(m, 8), backend="onnxruntime")
    assert "pool" in {d.node for d in result.report.quantized_ops}


@pytest.mark.parametrize(
    ("attrs", "shape", "declined"),
    [
        ({"ceil_mode": 1, "count_include_pad": 1, "kernel_shape": [2, 2]}, (1, 8, 7, 7), False),
        (
            {"ceil_mode": 1, "count_include_pad": 1, "kernel_shape": [2, 2], "strides": [2, 2]},
            (1, 8, 7, 7),
            True,
        ),
        (
            {"ceil_mode": 1, "count_include_pad": 1, "kernel_shape": [2, 2], "strides": [2, 2]},
            (1, 8, 8, 8),
            False,
        ),
        (
            {"ceil_mode": 1, "count_include_pad": 1, "kernel_shape": [3, 3], "strides": [2, 2]},
            (1, 8, "h", "w"),
            True,
        ),
        (
            {"ceil_mode": 1, "count_include_pad": 0, "kernel_shape": [2, 2], "strides": [2, 2]},
            (1, 8, 7, 7),
            False,
        ),
        ({"count_include_pad": 1, "kernel_shape": [2, 2], "strides": [2, 2]}, (1, 8, 7, 7), False),
    ],
)
def test_pool_overhang_decline(attrs, shape, declined):
    assert (pool_overhang_decline(attrs, shape) is not None) == declined
