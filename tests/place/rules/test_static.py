"""The activation-only placement rules (onnxq.place.rules.static) and the rule sets: a match
test, a decline test (with its reason) and a Q/DQ count per rule."""

from __future__ import annotations

import pytest
from onnx import helper

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.rules.sets import RULE_SETS
from tests import graphs
from tests.place.rules.placed import (  # noqa: F401  (the fixture turns cost rules off)
    _onnxruntime_without_cost_rules,
    annotated,
    decision,
    kinds,
    qdq_counts,
)
from tests.placement import annotate_graph

# These tests check what each rule places once it applies, so the onnxruntime profile's cost
# rules are off here (tests/profiles.py).


def test_rule_sets_are_ordered_tuples_weighted_ops_first():
    for name, expected in (
        ("tensorrt", ["residual_add"]),
        ("onnxruntime", ["binary", "concat", "unary"]),
    ):
        rules = RULE_SETS[name]
        names = [r.name for r in rules]
        assert isinstance(rules, tuple) and len(set(names)) == len(names)
        assert names[:3] == ["conv", "gemm", "matmul"]  # priority is the order
        assert [n for n in names if n in expected] == expected
        assert all(r.doc for r in rules)


# ------------------------------------------------------------------------------- residual_add
def test_residual_add_match_quantizes_only_the_skip_input():
    ann = annotated(graphs.residual_add())
    d = decision(ann, "add")
    assert d.quantized and d.rule == "residual_add" and d.tensors == ("skip",)
    assert "conv2_out" not in ann.tensors
    assert ann.tensors["skip"].kind == "activation"
    assert ann.tensors["skip"].consumers == [("conv2", 0), ("add", 1)]
    assert ann.tensors["skip"].rules == ["conv", "residual_add"]


def test_residual_add_decline_without_conv_producer():
    d = decision(annotated(graphs.binary("Add")), "binary")
    assert not d.quantized and d.rule == "residual_add"
    assert "neither input comes straight from a quantized Conv/ConvTranspose" in d.reason


def test_residual_add_decline_broadcast():
    d = decision(annotated(graphs.conv_add_broadcast()), "add")
    assert not d.quantized and "different shapes, [1, 16, 8, 8] and [1, 16, 1, 1]" in d.reason


def test_residual_add_with_differently_named_symbolic_sizes_says_they_cannot_be_shown_equal():
    m = graphs.residual_add()
    m.graph.value_info.extend(
        [
            graphs.tensor("skip", [1, 16, "h1", "w1"]),
            graphs.tensor("conv2_out", [1, 16, "h2", "w2"]),
        ]
    )
    ann = annotate_graph(ir.Graph(m), PROFILES["tensorrt"])
    d = decision(ann, "add")
    assert not d.quantized and d.reason.startswith(
        "inputs have shapes that cannot be shown equal, [1, 16, h2, w2] and [1, 16, h1, w1]"
    )


def test_residual_add_decline_when_the_conv_is_float():
    ann = annotated(graphs.residual_add(), exclude=("conv2",))
    assert decision(ann, "conv2").reason == "excluded by --exclude conv2"
    assert not decision(ann, "add").quantized


def test_residual_add_qdq_count():
    # x and skip get Q/DQ (skip shared by conv2 and the Add), plus two weight DQs
    assert qdq_counts(graphs.residual_add(), "tensorrt") == (2, 4)
    # onnxruntime: also conv2's output (read by the Add), and two int32 bias DQs
    assert qdq_counts(graphs.residual_add(), "onnxruntime") == (3, 7)


# ------------------------------------------------------------------------------- binary
@pytest.mark.parametrize("op_type", ["Add", "Mul"])
def test_binary_match_inputs_and_output(op_type):
    ann = annotated(graphs.binary(op_type), "onnxruntime")
    assert kinds(ann) == {
        "a": ("activation", None),
        "b": ("activation", None),
        "bin_out": ("activation", None),
    }
    assert ann.tensors["bin_out"].consumers == [("relu", 0)]
    assert decision(ann, "binary").rule == "binary"


def test_binary_folds_a_following_relu_into_its_output_quantization():
    # ResNet's join: Add -> Relu -> Conv.  onnxruntime drops a Relu before a Q whose zero
    # point is the type's minimum, so the Q/DQ goes on the Relu's output and QLinearAdd fuses
    r = graphs.rng(4)
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="binary"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    shape = [1, 16, 8, 8]
    model = graphs.model(
        nodes,
        [graphs.tensor("a", shape), graphs.tensor("b", shape)],
        [graphs.tensor("y", shape)],
        [graphs.init("w", graphs.weight(r, 16, 16, 3, 3))],
    )
    ann = annotated(model, "onnxruntime")
    assert decision(ann, "binary").quantized
    assert decision(ann, "relu").rule == "fused"
    assert "s" not in ann.tensors and ann.tensors["r"].consumers == [("conv", 0)]


def test_binary_decline_constant_input():
    d = decision(annotated(graphs.mul_const(), "onnxruntime"), "binary")
    assert not d.quantized and d.rule == "binary"
    assert d.reason == "input 'mul.scale' is a constant, not an activation"


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (lambda: graphs.binary("Add"), (3, 3)),
        (lambda: graphs.binary("Mul"), (3, 3)),
        (lambda: graphs.binary("Add", tail=False), (2, 2)),  # graph output: no output Q/DQ
        (graphs.mul_const, (0, 0)),
    ],
)
def test_binary_qdq_count(builder, expected):
    assert qdq_counts(builder(), "onnxruntime") == expected


def test_binary_is_not_in_the_tensorrt_rule_set():
    assert qdq_counts(graphs.binary("Mul"), "tensorrt") == (0, 0)
    d = decision(annotated(graphs.binary("Mul")), "binary")
    assert "no tensorrt rule quantizes Mul" in d.reason


# ------------------------------------------------------------------------------- concat
def test_concat_match_inputs_and_output():
    ann = annotated(graphs.concat(), "onnxruntime")
    assert kinds(ann) == {
        "a": ("activation", None),
        "b": ("activation", None),
        "cat_out": ("activation", None),
    }
    assert decision(ann, "concat").rule == "concat"


def test_concat_decline_when_output_is_a_graph_output():
    d = decision(annotated(graphs.concat(tail=False), "onnxruntime"), "concat")
    assert not d.quantized and d.rule == "concat"
    assert "graph output or unread" in d.reason


@pytest.mark.parametrize(("tail", "expected"), [(True, (3, 3)), (False, (0, 0))])
def test_concat_qdq_count(tail, expected):
    assert qdq_counts(graphs.concat(tail=tail), "onnxruntime") == expected


# ------------------------------------------------------------------------------- unary
@pytest.mark.parametrize("op_type", ["Sigmoid", "GlobalAveragePool"])
def test_unary_match_input_and_output(op_type):
    ann = annotated(graphs.unary(op_type), "onnxruntime")
    assert kinds(ann) == {"x": ("activation", None), "unary_out": ("activation", None)}
    assert decision(ann, "unary").rule == "unary"


def test_unary_ops_are_the_profiles_unary_kernels():
    # the rule repeats no op list: a profile without an integer Sigmoid leaves it to no rule
    (unary,) = [r for r in RULE_SETS["onnxruntime"] if r.name == "unary"]
    assert unary.op_types == frozenset()
    assert unary.anchors(PROFILES["onnxruntime"]) == PROFILES["onnxruntime"].unary_kernel_ops
    assert PROFILES["onnxruntime"].unary_kernel_ops <= PROFILES["onnxruntime"].integer_kernel_ops
    graph = ir.Graph(ir.infer_shapes(graphs.unary("Sigmoid")))
    profile = PROFILES["onnxruntime"].replace(unary_kernel_ops=frozenset({"AveragePool"}))
    d = decision(annotate_graph(graph, profile, QuantConfig(backend="onnxruntime")), "unary")
    assert not d.quantized and d.reason == "no onnxruntime rule quantizes Sigmoid: it stays float"


def test_unary_decline_when_output_is_a_graph_output():
    d = decision(annotated(graphs.unary("Sigmoid", tail=False), "onnxruntime"), "unary")
    assert not d.quantized and d.rule == "unary"
    assert "no integer kernel to fuse" in d.reason


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (lambda: graphs.unary("Sigmoid"), (2, 2)),
        (lambda: graphs.unary("GlobalAveragePool"), (2, 2)),
        (lambda: graphs.unary("Sigmoid", tail=False), (0, 0)),
        (graphs.two_branch_concat, (5, 9)),
    ],
)
def test_unary_qdq_count(builder, expected):
    assert qdq_counts(builder(), "onnxruntime") == expected


# ------------------------------------------------------------------------------- shape paths
@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_shape_subgraph_tensors_are_never_annotated(backend):
    ann = annotated(graphs.with_tail(graphs.shape_subgraph()), backend)
    shape_tensors = {"x_shape", "batch", "new_shape", "gather.index", "reshape.tail"}
    assert not shape_tensors & set(ann.tensors)
    assert kinds(ann) == {
        "x4d": ("activation", None),
        "conv.weight": ("weight", 0),
        **(
            {"conv.bias": ("bias", 0), "y": ("activation", None)}
            if backend == "onnxruntime"
            else {}
        ),
    }
    for node in ("shape", "gather", "concat"):
        d = decision(ann, node)
        assert not d.quantized and d.reason == "shape/index computation: never quantized"


def test_shape_subgraph_qdq_count():
    assert qdq_counts(graphs.shape_subgraph(), "tensorrt") == (1, 2)
    assert qdq_counts(graphs.shape_subgraph(), "onnxruntime") == (0, 0)  # output is graph output
    assert qdq_counts(graphs.with_tail(graphs.shape_subgraph()), "onnxruntime") == (2, 4)


def test_control_flow_node_stays_float_with_a_reason():
    ann = annotated(graphs.if_model())
    d = decision(ann, "if")
    assert not d.quantized and "is control flow" in d.reason and "then_branch" in d.reason
    # the branches' ops have decisions of their own
    assert not decision(ann, "else_neg").quantized and decision(ann, "else_neg").reason
    assert decision(ann, "conv").quantized
