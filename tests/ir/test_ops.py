"""onnxq.ir.ops: the one table of weighted ops, read by every stage."""

from __future__ import annotations

import pytest

from onnxq import ir
from onnxq.ir.ops import BIAS_READERS, WEIGHT_AXES, WEIGHTED_OP_TYPES, WEIGHTED_OPS, WeightAxis


def test_the_weighted_ops_in_report_order():
    assert WEIGHTED_OP_TYPES == ("Conv", "ConvTranspose", "Gemm", "MatMul")
    assert frozenset(WEIGHTED_OP_TYPES) == WEIGHTED_OPS and ir.WEIGHTED_OPS is WEIGHTED_OPS


def test_bias_readers_are_the_weighted_ops_with_a_bias_input():
    assert {"Conv", "ConvTranspose", "Gemm"} == BIAS_READERS and ir.BIAS_READERS is BIAS_READERS


def test_the_stages_read_the_table():
    from onnxq.mixed import sensitivity
    from onnxq.recover import layers

    assert sensitivity.WEIGHTED_OPS is WEIGHTED_OPS
    assert WEIGHTED_OPS - {"ConvTranspose"} == layers.LAYER_OPS


@pytest.mark.parametrize(
    ("op_type", "attrs", "rank", "axis"),
    [
        ("Conv", {}, 4, 0),
        ("ConvTranspose", {"group": 2}, 4, 1),
        ("Gemm", {"transB": 1}, 2, 0),
        ("Gemm", {"transB": 0}, 2, 1),
        ("Gemm", {}, 2, 1),
        ("MatMul", {}, 2, 1),
        ("MatMul", {}, 3, 2),
    ],
)
def test_weight_axis_resolution(op_type, attrs, rank, axis):
    assert WEIGHT_AXES[op_type].resolve(attrs, rank) == axis


def test_weight_axis_of_a_scalar_is_zero():
    assert WeightAxis(-1).resolve({}, 0) == 0
