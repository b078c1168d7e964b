"""Simplify passes: each changes what it should, and outputs stay equal in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxq import ir
from onnxq.errors import InternalError
from onnxq.prepare.simplify import (
    DEFAULT_PASSES,
    constants_to_initializers,
    fold_batchnorm,
    fold_constants,
    fold_matmul_batchnorm,
    remove_identities,
    simplify,
    sum_to_add,
)
from tests import graphs


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, seeds=(0, 1)) -> None:
    onnx.checker.check_model(after)
    for seed in seeds:
        feed = graphs.random_inputs(before, seed=seed)
        for want, got in zip(run(before, feed), run(after, feed), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def apply(pass_fn, model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Run one pass on a copy the way ``simplify`` does (pass, then commit)."""
    graph = ir.Graph(ir.infer_shapes(copy(model)))
    modified = pass_fn(graph)
    graph.commit()
    return graph.model, modified


# ------------------------------------------------------------------------------- one pass each
def test_constants_to_initializers_moves_constant_nodes():
    before = graphs.with_constant_nodes()
    after, modified = apply(constants_to_initializers, before)
    assert modified
    assert graphs.op_types(after) == ["Conv", "Relu"]
    assert {t.name for t in after.graph.initializer} == {"conv.weight", "conv.bias"}
    assert_same_outputs(before, after)


def test_constants_to_initializers_reports_no_change_without_constants():
    after, modified = apply(constants_to_initializers, graphs.conv_relu())
    assert not modified and graphs.op_types(after) == ["Conv", "Relu"]


def sum_model(n_inputs: int) -> onnx.ModelProto:
    """x -> Conv, then Sum(Conv out, x[, x]) -> y: a Caffe2-style residual join."""
    r = graphs.rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c", "x", "x"][:n_inputs], ["y"], name="join"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, 8, 6, 6])],
        [graphs.tensor("y", [1, 8, 6, 6])],
        [graphs.init("w", graphs.weight(r, 8, 8, 3, 3))],
    )


def test_sum_to_add_rewrites_a_two_input_sum_only():
    before = sum_model(2)
    after, modified = apply(sum_to_add, before)
    assert modified and graphs.op_types(after) == ["Conv", "Add"]
    assert_same_outputs(before, after)
    for n in (1, 3):  # not an Add: left alone
        after, modified = apply(sum_to_add, sum_model(n))
        assert not modified and graphs.count_ops(after, "Sum") == 1


def test_remove_identities_drops_identity_and_inference_dropout():
    before = graphs.identity_dropout()
    after, modified = apply(remove_identities, before)
    assert modified
    assert graphs.op_types(after) == ["Conv", "Relu"]
    conv, relu = after.graph.node
    assert conv.input[0] == "x" and relu.input[0] == conv.output[0]
    assert_same_outputs(before, after)


def test_remove_identities_keeps_an_identity_that_is_a_graph_output():
    before = graphs.model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Identity", ["r"], ["y"], name="identity"),
        ],
        [graphs.tensor("x", [4])],
        [graphs.tensor("y", [4])],
    )
    after, modified = apply(remove_identities, before)
    assert not modified and graphs.op_types(after) == ["Relu", "Identity"]


def test_remove_identities_keeps_training_mode_dropout():
    before = graphs.model(
        [helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="dropout")],
        [graphs.tensor("x", [4])],
        [graphs.tensor("y", [4])],
        [graphs.init("ratio", np.array(0.5, np.float32)), graphs.init("training", np.array(True))],
    )
    relu_after = graphs.model(
        [*before.graph.node, helper.make_node("Relu", ["y"], ["z"], name="relu")],
        [graphs.tensor("x", [4])],
        [graphs.tensor("z", [4])],
        before.graph.initializer,
    )
    after, modified = apply(remove_identities, relu_after)
    assert not modified and graphs.op_types(after) == ["Dropout", "Relu"]


def test_fold_constants_evaluates_constant_subgraphs():
    r = graphs.rng(3)
    w = graphs.weight(r, 16, 16, 3, 3)
    before = graphs.model(
        [
            helper.make_node("Mul", ["w_raw", "two"], ["w_scaled"], name="scale_w"),
            helper.make_node("Conv", ["x", "w_scaled"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        ],
        [graphs.tensor("x", [1, 16, 8, 8])],
        [graphs.tensor("y", [1, 16, 8, 8])],
        [graphs.init("w_raw", w), graphs.init("two", np.array(2.0, np.float32))],
    )
    after, modified = apply(fold_constants, before)
    assert modified and graphs.op_types(after) == ["Conv"]
    folded = ir.Graph(after).const_value("w_scaled")
    np.testing.assert_array_equal(folded, w * np.float32(2.0))
    assert_same_outputs(before, after)


def test_fold_constants_folds_shape_of_a_static_tensor():
    before = graphs.model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape"),
        ],
        [graphs.tensor("x", [2, 3])],
        [graphs.tensor("y", [2, 3])],
    )
    after, modified = apply(fold_constants, before)
    assert modified and graphs.op_types(after) == ["Reshape"]
    assert ir.Graph(after).const_value("s").tolist() == [2, 3]
    assert_same_outputs(before, after)


def test_fold_constants_keeps_dynamic_shapes_and_random_ops():
    after, modified = apply(fold_constants, graphs.shape_subgraph())
    assert not modified
    assert graphs.op_types(after) == ["Shape", "Gather", "Concat", "Reshape", "Conv"]
    rand = graphs.model(
        [
            helper.make_node("RandomUniform", [], ["noise"], name="rand", shape=[4]),
            helper.make_node("Add", ["x", "noise"], ["y"], name="add"),
        ],
        [graphs.tensor("x", [4])],
        [graphs.tensor("y", [4])],
    )
    after, modified = apply(fold_constants, rand)
    assert not modified and graphs.op_types(after) == ["RandomUniform", "Add"]


@pytest.mark.parametrize(
    ("builder", "ops_after"),
    [
        (graphs.conv_bn_relu, ["Conv", "Relu"]),
        (lambda: graphs.conv_transpose_bn(group=1), ["ConvTranspose"]),
        (lambda: graphs.conv_transpose_bn(group=2), ["ConvTranspose"]),
        (lambda: graphs.conv_transpose_bn(group=4), ["ConvTranspose"]),
        (lambda: graphs.gemm_bn(trans_b=True), ["Gemm", "Relu"]),
        (lambda: graphs.gemm_bn(trans_b=False), ["Gemm", "Relu"]),
    ],
    ids=[
        "conv",
        "convtranspose",
        "convtranspose_group2",
        "convtranspose_group4",
        "gemm_transb1",
        "gemm_transb0",
    ],
)
def test_fold_batchnorm_pass(builder, ops_after):
    before = builder()
    after, modified = apply(fold_batchnorm, before)
    assert modified and graphs.op_types(after) == ops_after
    producer = after.graph.node[0]
    assert len(producer.input) == 3  # the folded bias is now the op's bias input
    assert_same_outputs(before, after)


def test_fold_batchnorm_skips_a_conv_output_read_twice():
    base = graphs.conv_bn_relu()
    nodes = [*base.graph.node, helper.make_node("Add", ["y", "conv_out"], ["z"], name="add")]
    before = graphs.model(
        nodes, base.graph.input, [graphs.tensor("z", [1, 16, 8, 8])], base.graph.initializer
    )
    after, modified = apply(fold_batchnorm, before)
    assert not modified and "BatchNormalization" in graphs.op_types(after)


# ------------------------------------------------------------------------------- the driver
SIMPLIFY_CASES = {
    "with_constant_nodes": (
        graphs.with_constant_nodes,
        ["Conv", "Relu"],
        ["constants_to_initializers"],
    ),
    "identity_dropout": (graphs.identity_dropout, ["Conv", "Relu"], ["remove_identities"]),
    "conv_bn_relu": (graphs.conv_bn_relu, ["Conv", "Relu"], ["fold_batchnorm"]),
    "conv_transpose_bn": (graphs.conv_transpose_bn, ["ConvTranspose"], ["fold_batchnorm"]),
    "gemm_bn_transb1": (lambda: graphs.gemm_bn(True), ["Gemm", "Relu"], ["fold_batchnorm"]),
    "gemm_bn_transb0": (lambda: graphs.gemm_bn(False), ["Gemm", "Relu"], ["fold_batchnorm"]),
    "conv_relu": (graphs.conv_relu, ["Conv", "Relu"], []),
    "shape_subgraph": (graphs.shape_subgraph, ["Shape", "Gather", "Concat", "Reshape", "Conv"], []),
    "if_model": (graphs.if_model, ["Conv", "Relu", "If"], []),
}


@pytest.mark.parametrize("case", sorted(SIMPLIFY_CASES))
def test_simplify_changes_ops_and_keeps_outputs(case):
    builder, ops_after, fired = SIMPLIFY_CASES[case]
    before = builder()
    after, passes = simplify(ir.infer_shapes(copy(before)))
    assert graphs.op_types(after) == ops_after
    assert passes == fired
    assert_same_outputs(before, after)


def test_simplify_reaches_a_fixed_point():
    once, _ = simplify(ir.infer_shapes(graphs.conv_bn_relu()))
    twice, passes = simplify(copy(once))
    assert passes == []
    assert ir.serialize(twice) == ir.serialize(once)


def test_simplify_names_the_failing_pass():
    def broken(graph: ir.Graph) -> bool:
        raise RuntimeError("boom")

    with pytest.raises(InternalError, match=r"simplify pass broken failed.*boom") as caught:
        simplify(graphs.conv_relu(), passes=(broken,))
    assert "--no-simplify" in str(caught.value) and "this is a bug in onnxq" in str(caught.value)


def test_default_passes_order():
    assert [p.__name__ for p in DEFAULT_PASSES] == [
        "constants_to_initializers",
        "remove_identities",
        "sum_to_add",
        "fold_constants",
        "fold_pad",
        "fold_batchnorm",
        "fold_matmul_batchnorm",
        "fold_channel_mul",
        "fold_bias_add",
        "fuse_hardswish",
        "decompose_prelu",
        "reciprocal_sqrt_to_div",
    ]


def _matmul_bn(x_shape: list[int], flatten_axis: int | None) -> onnx.ModelProto:
    """x @ W[8, 6] [-> Flatten(axis)] -> BatchNormalization (and a Shape of the product, as
    LeViT's exporter writes for the Reshape back) -> y."""
    from onnx import helper

    r = graphs.rng(2)
    inits = [
        graphs.init("w", graphs.weight(r, 8, 6)),
        graphs.init("g", (r.random(6) + 0.5).astype(np.float32)),
        graphs.init("b", graphs.weight(r, 6)),
        graphs.init("m", graphs.weight(r, 6)),
        graphs.init("v", (r.random(6) + 0.2).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
        helper.make_node("Shape", ["p"], ["s"], name="shape"),
    ]
    src = "p"
    if flatten_axis is not None:
        nodes.append(helper.make_node("Flatten", ["p"], ["f"], name="flat", axis=flatten_axis))
        src = "f"
    nodes.append(
        helper.make_node("BatchNormalization", [src, "g", "b", "m", "v"], ["y"], name="bn")
    )
    rows = int(np.prod(x_shape[:-1])) if flatten_axis == len(x_shape) - 1 else None
    out = [rows, 6] if rows else ["a", "b", "c"][: len(x_shape)]
    return graphs.model(
        nodes,
        [graphs.tensor("x", x_shape)],
        [graphs.tensor("y", out), graphs.tensor("s", [len(x_shape)], onnx.TensorProto.INT64)],
        inits,
    )


@pytest.mark.parametrize(("x_shape", "axis"), [([2, 3, 8], 2), ([2, 3, 8], -1), ([4, 8], None)])
def test_batchnorm_over_a_matmuls_columns_folds_into_its_weight(x_shape, axis):
    before = _matmul_bn(x_shape, axis)
    after, modified = apply(fold_matmul_batchnorm, before)
    assert modified and "BatchNormalization" not in graphs.op_types(after)
    x = graphs.rng(8).standard_normal(x_shape).astype(np.float32)
    for want, got in zip(run(before, {"x": x}), run(after, {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("x_shape", "axis"), [([2, 3, 8], None), ([2, 3, 8], 1)])
def test_batchnorm_over_another_axis_of_a_matmul_stays(x_shape, axis):
    # rank 3 without Flatten: BatchNorm's axis 1 is the tokens; Flatten(axis=1): C is merged
    after, modified = apply(fold_matmul_batchnorm, _matmul_bn(x_shape, axis))
    assert not modified and "BatchNormalization" in graphs.op_types(after)
