"""onnxq.materialize.writers: the nodes and constants one placement writes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxq import ir
from onnxq.materialize.writers import dequantized_const, int32_bias, qdq_pair
from onnxq.numerics.qparams import QParams


def _relu() -> ir.Graph:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return ir.Graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_pair_reads_one_scale_and_zero_point_and_returns_the_dequantized_name():
    graph = _relu()
    qp = QParams(np.float32(0.5), np.int8(0))
    out = qdq_pair(graph, "x", qp, 13)
    ops = [n.op_type for n in graph.nodes]
    assert ops == ["Relu", "QuantizeLinear", "DequantizeLinear"] and out == "x_dequantized"
    q, dq = graph.nodes[1], graph.nodes[2]
    assert q.input[1:] == dq.input[1:] and dq.input[0] == q.output[0]


def test_a_stored_constant_sits_behind_one_dequantize_with_its_axis():
    graph = _relu()
    qp = QParams(np.array([0.1, 0.2], np.float32), np.zeros(2, np.int8), axis=0)
    out = dequantized_const(graph, "w", np.array([[1, -1], [2, 3]], np.int8), qp)
    (dq,) = [n for n in graph.nodes if n.op_type == "DequantizeLinear"]
    assert dq.output[0] == out and ir.node_attrs(dq) == {"axis": 0}
    assert graph.const_value(dq.input[0]).dtype == np.int8


def test_an_int32_bias_rounds_at_the_scale_and_saturates():
    qp = QParams(np.array([0.5, 1e-12], np.float32), np.zeros(2, np.int32))
    assert int32_bias(np.array([1.26, 1.0], np.float32), qp).tolist() == [3, 2**31 - 1]
