"""A layer as rows times a weight matrix: the rows of every Conv geometry, Gemm and MatMul
reproduce onnxruntime's output."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxq import ir
from onnxq.recover.layers import linear_layer
from tests.graphs import init, model, tensor


def layer_model(op: str, x_shape, w: np.ndarray, **attrs):
    """One ``op`` layer; its output's shape is left to inference."""
    node = helper.make_node(op, ["x", "w"], ["y"], name="layer", **attrs)
    graph = helper.make_graph(
        [node],
        "layer",
        [tensor("x", list(x_shape))],
        [helper.ValueInfoProto(name="y")],
        [init("w", w)],
    )
    graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def ort_run(m, x):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


CONVS = [
    ((2, 4, 7, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    (
        (2, 4, 7, 9),
        (8, 2, 3, 2),
        {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 1]},
    ),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 3, 20), (5, 3, 4), {"pads": [2, 1], "strides": [3], "dilations": [2]}),
    ((1, 2, 5, 5, 5), (3, 2, 2, 2, 2), {}),
]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    CONVS,
    ids=["plain", "grouped-strided-dilated", "depthwise", "same-upper", "same-lower", "1d", "3d"],
)
def test_conv_rows_times_matrix_is_the_conv(x_shape, w_shape, attrs):
    r = np.random.default_rng(0)
    x = r.standard_normal(x_shape).astype(np.float32)
    w = r.standard_normal(w_shape).astype(np.float32)
    m = layer_model("Conv", x_shape, w, **attrs)
    y = ort_run(m, x)
    layer = linear_layer(ir.Graph(m), m.graph.node[0])
    assert not isinstance(layer, str)
    rows = layer.rows(x)
    assert rows.shape[1] == layer.positions(x)
    got = rows @ layer.matrix(w).transpose(0, 2, 1)  # [G, rows, O/G]
    g, n = layer.groups, x.shape[0]
    want = y.reshape(n, g, y.shape[1] // g, -1).transpose(1, 0, 3, 2).reshape(got.shape)
    assert np.abs(got - want).max() < 1e-4
    take = np.array([0, 3, rows.shape[1] - 1])
    np.testing.assert_array_equal(layer.rows(x, take), rows[:, take])
    np.testing.assert_array_equal(layer.from_matrix(layer.matrix(w)), w)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_and_matmul_rows(trans_b):
    r = np.random.default_rng(1)
    x = r.standard_normal((5, 7)).astype(np.float32)
    w = r.standard_normal((3, 7) if trans_b else (7, 3)).astype(np.float32)
    for m in (
        layer_model("Gemm", x.shape, w, transB=trans_b),
        layer_model("MatMul", x.shape, w) if not trans_b else None,
    ):
        if m is None:
            continue
        layer = linear_layer(ir.Graph(m), m.graph.node[0])
        assert not isinstance(layer, str) and layer.outputs == 3 and layer.row_length == 7
        got = layer.rows(x)[0] @ layer.matrix(w)[0].T
        np.testing.assert_allclose(got, ort_run(m, x), atol=1e-5)
        np.testing.assert_array_equal(layer.from_matrix(layer.matrix(w)), w)


def test_matmul_rows_of_a_3d_input_and_reasons():
    r = np.random.default_rng(2)
    x = r.standard_normal((2, 4, 7)).astype(np.float32)
    w = r.standard_normal((7, 3)).astype(np.float32)
    m = layer_model("MatMul", x.shape, w)
    layer = linear_layer(ir.Graph(m), m.graph.node[0])
    assert not isinstance(layer, str)
    got = (layer.rows(x)[0] @ layer.matrix(w)[0].T).reshape(2, 4, 3)
    np.testing.assert_allclose(got, ort_run(m, x), atol=1e-5)
    batched = layer_model("MatMul", x.shape, r.standard_normal((2, 7, 3)).astype(np.float32))
    assert "rank 3" in linear_layer(ir.Graph(batched), batched.graph.node[0])
    relu = model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [tensor("x", [2])], [tensor("y", [2])]
    )
    assert "not a Conv" in linear_layer(ir.Graph(relu), relu.graph.node[0])
