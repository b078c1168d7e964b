"""fold_bias_add / fold_channel_mul: Conv followed by an Add (a Mul) of a per-channel constant
becomes one Conv with that bias (those scaled weights and bias); anything that varies over other
axes, or a conv output read elsewhere, is left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq import ir
from onnxq.prepare.bias_add import fold_bias_add, fold_channel_mul
from onnxq.prepare.simplify import simplify
from tests import graphs
from tests.prepare.test_simplify import apply, assert_same_outputs

C = 8


def conv_add(
    bias_shape: tuple[int, ...] = (1, C, 1, 1),
    conv_bias: bool = False,
    const_first: bool = False,
    second_reader: bool = False,
    transpose: bool = False,
    op_type: str = "Add",
) -> onnx.ModelProto:
    """x -> Conv(/ConvTranspose) -> Add (``op_type``) constant of ``bias_shape`` -> Relu -> y."""
    r = graphs.rng(1)
    op = "ConvTranspose" if transpose else "Conv"
    conv_inputs = ["x", "w", "b"] if conv_bias else ["x", "w"]
    inits = [
        graphs.init("w", graphs.weight(r, C, C, 3, 3)),
        graphs.init("k", graphs.weight(r, *bias_shape, scale=1.0)),
    ]
    if conv_bias:
        inits.append(graphs.init("b", graphs.weight(r, C)))
    add_inputs = ["k", "conv_out"] if const_first else ["conv_out", "k"]
    nodes = [
        helper.make_node(op, conv_inputs, ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(op_type, add_inputs, ["add_out"], name="add"),
        helper.make_node("Relu", ["add_out"], ["y"], name="relu"),
    ]
    outputs = [graphs.tensor("y", [1, C, 6, 6])]
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", ["conv_out"], ["side"], name="side"))
        outputs.append(graphs.tensor("side", [1, C, 6, 6]))
    return graphs.model(nodes, [graphs.tensor("x", [1, C, 6, 6])], outputs, inits)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"conv_bias": True},
        {"const_first": True},
        {"bias_shape": (C, 1, 1)},
        {"bias_shape": (1,)},
        {"bias_shape": (1, 1, 1, 1), "conv_bias": True},
        {"transpose": True, "conv_bias": True},
    ],
)
def test_fold_bias_add_folds_a_per_channel_constant(options):
    before = conv_add(**options)
    after, modified = apply(fold_bias_add, before)
    assert modified
    assert graphs.op_types(after) == [before.graph.node[0].op_type, "Relu"]
    conv = after.graph.node[0]
    assert len(conv.input) == 3 and conv.output[0] == "add_out"
    assert_same_outputs(before, after)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"bias_shape": (1, C, 6, 6)}, "varies over space"),
        ({"bias_shape": (C,)}, "broadcasts along the last (width) axis, not channels"),
        ({"bias_shape": (2, C, 1, 1)}, "would broadcast the batch"),
        ({"second_reader": True}, "the conv output is read by another node"),
    ],
)
def test_fold_bias_add_declines(options, why):
    before = conv_add(**options)
    after, modified = apply(fold_bias_add, before)
    assert not modified, why
    assert graphs.count_ops(after, "Add") == 1


def test_fold_bias_add_declines_an_add_of_two_activations():
    before = graphs.residual_add()
    after, modified = apply(fold_bias_add, before)
    assert not modified and graphs.count_ops(after, "Add") == 1


def test_fold_bias_add_keeps_the_bias_dtype_and_values():
    before = conv_add(conv_bias=True)
    after, _ = apply(fold_bias_add, before)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in after.graph.initializer}
    folded = inits[after.graph.node[0].input[2]]
    original = {t.name: onnx.numpy_helper.to_array(t) for t in before.graph.initializer}
    assert folded.dtype == np.float32
    np.testing.assert_allclose(folded, original["b"] + original["k"].reshape(-1), rtol=0)


MUL_FOLDS = [
    {},
    {"conv_bias": True},
    {"const_first": True},
    {"bias_shape": (C, 1, 1)},
    {"transpose": True, "conv_bias": True},
]


@pytest.mark.parametrize("options", MUL_FOLDS)
def test_fold_channel_mul_scales_weight_and_bias(options):
    before = conv_add(op_type="Mul", **options)
    after, modified = apply(fold_channel_mul, before)
    assert modified
    assert graphs.op_types(after) == [before.graph.node[0].op_type, "Relu"]
    conv = after.graph.node[0]
    assert conv.output[0] == "add_out" and len(conv.input) == len(before.graph.node[0].input)
    assert_same_outputs(before, after)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"bias_shape": (1, C, 6, 6)}, "varies over space"),
        ({"bias_shape": (C,)}, "broadcasts along the last (width) axis, not channels"),
        ({"second_reader": True}, "the conv output is read by another node"),
        ({"bias_shape": (1,)}, "one scalar for every channel (a learnable affine block)"),
    ],
)
def test_fold_channel_mul_declines(options, why):
    before = conv_add(op_type="Mul", **options)
    after, modified = apply(fold_channel_mul, before)
    assert not modified, why
    assert graphs.count_ops(after, "Mul") == 1


def test_conv_mul_add_batch_norm_folds_into_one_conv():
    # Caffe2 / frozen-batch-norm exports: Conv -> Mul(s) -> Add(b) -> Relu
    r = graphs.rng(2)
    inits = [
        graphs.init("w", graphs.weight(r, C, C, 3, 3)),
        graphs.init("s", graphs.weight(r, 1, C, 1, 1, scale=2.0)),
        graphs.init("b", graphs.weight(r, 1, C, 1, 1)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "s"], ["m"], name="scale"),
        helper.make_node("Add", ["m", "b"], ["a"], name="shift"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    before = graphs.model(
        nodes, [graphs.tensor("x", [1, C, 6, 6])], [graphs.tensor("y", [1, C, 6, 6])], inits
    )
    after, passes = simplify(ir.infer_shapes(before))  # as onnxq.ir.load_model leaves it
    assert graphs.op_types(after) == ["Conv", "Relu"]
    assert {"fold_channel_mul", "fold_bias_add"} <= set(passes)
    assert_same_outputs(before, after)
