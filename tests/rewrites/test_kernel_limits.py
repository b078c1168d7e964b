"""FP8 conv limits (ModelOpt's FP8 placement): small-channel and large-filter convs stay float."""

from __future__ import annotations

import pytest
from onnx import helper

from onnxq import ir
from onnxq.backends.profile import TENSORRT
from onnxq.backends.target import profile_for
from onnxq.config import QuantConfig
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from onnxq.rewrites.kernel_limits import conv_kernel_decline
from tests import graphs

FP8 = profile_for(QuantConfig(precision="fp8").target)[0]


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


def decision(model, profile):
    graph = ir.Graph(ir.infer_shapes(model))
    options = QuantConfig(precision="fp8").placement
    ann = annotate(GraphFacts.of(graph, profile), profile, options)
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
