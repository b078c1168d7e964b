"""Per-layer sensitivity: candidates, multiply-adds, and the ranking's order."""

from __future__ import annotations

import pytest

import onnxq
from onnxq import ir
from onnxq.mixed.sensitivity import boundary_elements
from onnxq.place.macs import layer_macs
from tests import graphs
from tests.mixed.test_search import conv_chain


def test_layer_macs_of_conv_gemm_matmul():
    conv = ir.Graph(ir.infer_shapes(graphs.conv_relu(channels=16, out_channels=32, size=8)))
    assert layer_macs(conv, conv.node_by_name("conv")) == 32 * 8 * 8 * 16 * 9
    gemm = ir.Graph(ir.infer_shapes(graphs.gemm(k=32, n=16)))
    (node,) = [n for n in gemm.nodes if n.op_type == "Gemm"]
    assert layer_macs(gemm, node) == 32 * 16
    mm = ir.Graph(ir.infer_shapes(graphs.matmul_const(k=32, n=16)))
    (node,) = [n for n in mm.nodes if n.op_type == "MatMul"]
    shape = mm.shape(node.output[0])
    assert layer_macs(mm, node) == 32 * 16 * (shape[-2] if len(shape) > 2 else 1)


def test_boundary_elements_count_input_and_output():
    conv = ir.Graph(ir.infer_shapes(graphs.conv_relu(channels=16, out_channels=32, size=8)))
    assert boundary_elements(conv, conv.node_by_name("conv")) == 16 * 64 + 32 * 64


def test_ranking_lists_every_quantized_conv_most_harmful_first():
    m = conv_chain(layers=5, loud=4)  # conv4 reads the loud channel; nothing after it
    record = onnxq.quantize(
        m, graphs.random_batches(m, 16), progress=False, target="cosine=0"
    ).report.mixed_precision
    ranking = record["sensitivity"]
    assert sorted(s["node"] for s in ranking) == [f"conv{i}" for i in range(5)]
    assert ranking[0]["node"] == "conv4"
    gains = [s["gain"] for s in ranking]
    assert gains == sorted(gains, reverse=True)
    for s in ranking:
        assert s["score_float_alone"] - record["int8_score"] == pytest.approx(s["gain"], abs=2e-6)


@pytest.mark.parametrize("trans_b", [True, False])
def test_layer_macs_of_gemm_reading_an_input_of_unknown_width(trans_b):
    """A flattened input whose width shape inference lost: the constant weight gives K."""
    m = graphs.gemm(trans_b=trans_b, k=32, n=16)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "width"
    graph = ir.Graph(ir.infer_shapes(m))
    (node,) = [n for n in graph.nodes if n.op_type == "Gemm"]
    assert graph.shape(node.input[0])[1] == "width"
    assert layer_macs(graph, node) == 32 * 16
