"""The checker on weight-only layers: blocked DequantizeLinear and MatMulNBits."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq.backends.check import check
from onnxq.backends.profile import ONNXRUNTIME, TENSORRT
from onnxq.materialize.blocked import WeightOnlyLayer, materialize_weight_only, packed_4bit
from onnxq.numerics.blocks import BlockFormat, quantize_rtn
from tests import graphs
from tests.weightonly import models


def _blocked(block=64, signed=True, zero=None, axis=0, k=128, opset=21, scale_rows=None):
    q = np.random.default_rng(0).integers(-8, 8, size=(k, 16))
    rows = scale_rows if scale_rows is not None else -(-k // block)
    inits = [
        packed_4bit("wq", q if signed else q + 8, signed),
        graphs.init("ws", np.full((rows, 16), 0.01, np.float32)),
    ]
    inputs = ["wq", "ws"]
    if zero is not None:
        inits.append(packed_4bit("wz", np.full((rows, 16), zero), signed))
        inputs.append("wz")
    nodes = [
        helper.make_node("DequantizeLinear", inputs, ["w"], name="dq", axis=axis, block_size=block),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["rows", k])],
        [graphs.tensor("y", ["rows", 16])],
        inits,
        opset=opset,
    )


def test_a_valid_tensorrt_int4_layer_passes():
    assert check(_blocked(), TENSORRT) == []
    assert (
        check(_blocked(block=128, k=576), TENSORRT) == []
    )  # a short last block, as ModelOpt writes


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (lambda: _blocked(block=32), "block_size"),
        (lambda: _blocked(signed=False), "dtype"),
        (lambda: _blocked(zero=1), "zero_point"),
        (lambda: _blocked(axis=1), "axis"),
        (lambda: _blocked(scale_rows=3), "scale shape"),
    ],
)
def test_tensorrt_violations_name_the_field(model, field):
    violations = check(model(), TENSORRT)
    assert violations and field in {v.field for v in violations}


def test_blocked_dq_needs_opset_21():
    m = _blocked()
    m.opset_import[0].version = 19
    assert "opset" in {v.field for v in check(m, TENSORRT)}


def test_matmul_nbits_is_valid_for_onnxruntime_and_forbidden_for_tensorrt():
    m = models.linear()
    codes = quantize_rtn(
        onnx.numpy_helper.to_array(m.graph.initializer[0]), BlockFormat(4, 32, True)
    )
    materialize_weight_only(m, [WeightOnlyLayer("fc", "w", codes)], ONNXRUNTIME)
    assert check(m, ONNXRUNTIME) == []
    assert {v.field for v in check(m, TENSORRT)} == {"op_type"}


def test_matmul_nbits_with_a_wrong_block_size_is_a_violation():
    m = models.linear()
    codes = quantize_rtn(
        onnx.numpy_helper.to_array(m.graph.initializer[0]), BlockFormat(4, 32, True)
    )
    materialize_weight_only(m, [WeightOnlyLayer("fc", "w", codes)], ONNXRUNTIME)
    node = m.graph.node[0]
    for attr in node.attribute:
        if attr.name == "block_size":
            attr.i = 24
    assert "block_size" in {v.field for v in check(m, ONNXRUNTIME)}
