"""fold_bias_add: Conv followed by an Add of a per-channel constant becomes one Conv with that
bias; anything that varies over other axes, or a conv output read elsewhere, is left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq.rewrites.bias_add import fold_bias_add
from tests import graphs
from tests.rewrites.test_simplify import apply, assert_same_outputs

C = 8


def conv_add(bias_shape: tuple[int, ...] = (1, C, 1, 1), conv_bias: bool = False,
             const_first: bool = False, second_reader: bool = False,
             transpose: bool = False) -> onnx.ModelProto:
    """x -> Conv(/ConvTranspose) -> Add(constant of ``bias_shape``) -> Relu -> y."""
    r = graphs.rng(1)
    op = "ConvTranspose" if transpose else "Conv"
    conv_inputs = ["x", "w", "b"] if conv_bias else ["x", "w"]
    inits = [graphs.init("w", graphs.weight(r, C, C, 3, 3)),
             graphs.init("k", graphs.weight(r, *bias_shape, scale=1.0))]
    if conv_bias:
        inits.append(graphs.init("b", graphs.weight(r, C)))
    add_inputs = ["k", "conv_out"] if const_first else ["conv_out", "k"]
    nodes = [helper.make_node(op, conv_inputs, ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", add_inputs, ["add_out"], name="add"),
             helper.make_node("Relu", ["add_out"], ["y"], name="relu")]
    outputs = [graphs.tensor("y", [1, C, 6, 6])]
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", ["conv_out"], ["side"], name="side"))
        outputs.append(graphs.tensor("side", [1, C, 6, 6]))
    return graphs.model(nodes, [graphs.tensor("x", [1, C, 6, 6])], outputs, inits)


@pytest.mark.parametrize(
    "options",
    [{}, {"conv_bias": True}, {"const_first": True}, {"bias_shape": (C, 1, 1)},
     {"bias_shape": (1,)}, {"bias_shape": (1, 1, 1, 1), "conv_bias": True},
     {"transpose": True, "conv_bias": True}],
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
