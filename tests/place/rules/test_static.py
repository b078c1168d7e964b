"""Placement rules: a match test, a decline test (with its reason) and a Q/DQ count per rule."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.annotations import Annotations, Excluded
from onnxq.place.rules.sets import RULE_SETS
from tests import graphs
from tests.placement import annotate_graph
from tests.profiles import no_cost_rules

# These tests check what each rule places once it applies, so the onnxruntime profile's cost
# rules are off here (tests/profiles.py).


@pytest.fixture(autouse=True)
def _onnxruntime_without_cost_rules():
    with no_cost_rules():
        yield


def annotated(model: onnx.ModelProto, backend: str = "tensorrt", **options) -> Annotations:
    graph = ir.Graph(ir.infer_shapes(model))
    return annotate_graph(graph, PROFILES[backend], QuantConfig(backend=backend, **options))


def decision(ann: Annotations, node: str):
    (found,) = [d for d in ann.decisions if d.node == node]
    return found


def kinds(ann: Annotations) -> dict[str, tuple[str, int | None]]:
    return {t.tensor: (t.kind, t.axis) for t in ann.tensors.values()}


def qdq_counts(model: onnx.ModelProto, backend: str) -> tuple[int, int]:
    result = onnxq.quantize(model, graphs.random_batches(model, 3), backend=backend, progress=False)
    out = result.model
    return graphs.count_ops(out, "QuantizeLinear"), graphs.count_ops(out, "DequantizeLinear")


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


# ------------------------------------------------------------------------------- conv
def test_conv_match_tensorrt_quantizes_input_and_weight_axis_0():
    ann = annotated(graphs.conv_relu())
    assert kinds(ann) == {"x": ("activation", None), "conv.weight": ("weight", 0)}
    assert ann.tensors["x"].consumers == [("conv", 0)]
    assert ann.tensors["conv.weight"].consumers == [("conv", 1)]
    d = decision(ann, "conv")
    assert d.quantized and d.rule == "conv" and d.tensors == ("x", "conv.weight")
    relu = decision(ann, "relu")
    assert not relu.quantized and "no tensorrt rule quantizes Relu" in relu.reason


def test_conv_match_onnxruntime_adds_int32_bias():
    ann = annotated(graphs.with_tail(graphs.conv_relu()), "onnxruntime")
    assert kinds(ann) == {
        "x": ("activation", None),
        "conv.weight": ("weight", 0),
        "conv.bias": ("bias", 0),
        "y": ("activation", None),  # the fused Relu's output
    }
    assert ann.tensors["conv.bias"].inputs == ("x", "conv.weight")


def test_conv_match_onnxruntime_quantizes_the_fused_relu_output():
    ann = annotated(graphs.residual_add(), "onnxruntime")
    relu = decision(ann, "relu1")
    assert relu.quantized and relu.rule == "fused" and "conv1" in relu.reason
    assert kinds(ann)["skip"] == ("activation", None)  # Relu's output, not the Conv's
    assert "conv1_out" not in ann.tensors


def test_conv_whose_output_cannot_be_quantized_stays_float_for_onnxruntime():
    d = decision(annotated(graphs.conv_relu(), "onnxruntime"), "conv")
    assert not d.quantized and d.reason.startswith(
        "its output 'y' is a graph output (never quantized), and onnxruntime has no integer "
        "Conv with a float output"
    )


def test_conv_transpose_stays_float_for_onnxruntime_which_has_no_integer_kernel_for_it():
    # onnxruntime 1.31's CPU provider leaves DQ -> ConvTranspose -> Q unfused; tensorrt runs it
    model = graphs.with_tail(graphs.conv_transpose_bn(group=1), "Relu")
    ort = decision(annotated(model, "onnxruntime"), "convt")
    assert not ort.quantized and ort.reason == (
        "onnxruntime has no integer ConvTranspose kernel: Q/DQ around it would only add work "
        "and rounding error"
    )
    assert decision(annotated(model, "tensorrt"), "convt").quantized


def test_a_conv_whose_output_stays_float_for_a_data_reason_gives_that_reason():
    graph = ir.Graph(ir.infer_shapes(graphs.with_tail(graphs.conv_relu())))
    ann = annotate_graph(
        graph,
        PROFILES["onnxruntime"],
        excluded=Excluded(tensors={"y": "tensor 'y' reaches |x| = 2e+05"}),
    )
    d = decision(ann, "conv")
    assert not d.quantized and d.reason.startswith(
        "tensor 'y' reaches |x| = 2e+05, and onnxruntime has no integer Conv"
    )


def test_relu_is_not_reported_fused_when_no_output_qdq_is_placed():
    # conv_relu's Relu output is the graph output, so no Q follows the Relu and onnxruntime
    # cannot fuse Conv+Relu into an integer kernel: the report must not call the Relu quantized.
    ann = annotated(graphs.conv_relu(), "onnxruntime")
    assert "y" not in ann.tensors
    relu = decision(ann, "relu")
    assert not relu.quantized, relu


def test_conv_transpose_match_weight_axis_1():
    ann = annotated(graphs.conv_transpose())
    assert kinds(ann)["convt.weight"] == ("weight", 1)
    assert decision(ann, "convt").rule == "conv"


@pytest.mark.parametrize("spread, quantized", [(4.0, True), (100.0, False)])
def test_a_depthwise_conv_transpose_whose_kernels_share_one_scale(spread, quantized):
    # [C_in, K/g, kh, kw] with K/g = 1: TensorRT's weight axis 1 holds one scale for all 16
    # kernels; kernels 100x apart (a folded BatchNormalization) would round the small ones to 0
    model = graphs.conv_transpose(channels=16, out_channels=16, group=16)
    w = next(t for t in model.graph.initializer if t.name == "convt.weight")
    values = onnx.numpy_helper.to_array(w).copy()
    values[::2] /= spread
    w.CopyFrom(onnx.numpy_helper.from_array(values, "convt.weight"))
    d = decision(annotated(model), "convt")
    assert d.quantized is quantized, d.reason
    if not quantized:
        assert "shares each scale across the 16 groups" in d.reason
        assert "(> 16x)" in d.reason


def test_conv_decline_small_channels():
    ann = annotated(graphs.conv_small())
    d = decision(ann, "conv")
    assert not d.quantized and d.rule == "conv"
    assert "Conv with 3 input / 16 output channels" in d.reason
    assert "min_channels=16" in d.reason and "27 products per output, fewer than 128" in d.reason
    assert ann.tensors == {}


def test_conv_small_is_quantized_when_min_channels_is_disabled():
    ann = annotated(graphs.conv_small(), min_channels=0)
    assert decision(ann, "conv").quantized
    assert kinds(ann)["conv.weight"] == ("weight", 0)


def test_conv_decline_non_constant_weight():
    d = decision(annotated(graphs.conv_dynamic_weight()), "conv")
    assert not d.quantized
    assert d.reason == "weight 'w' is not a constant of rank >= 3"


def test_grouped_conv_decline_small_kernel_and_match_3x3():
    d = decision(annotated(graphs.grouped_conv(kernel=1)), "conv")
    assert not d.quantized and "grouped conv (group=2)" in d.reason and "kernel 1" in d.reason
    ann = annotated(graphs.grouped_conv(kernel=3))
    assert decision(ann, "conv").quantized
    assert kinds(ann)["conv.weight"] == ("weight", 0)


def test_the_grouped_conv_figures_are_the_profiles():
    graph = ir.Graph(ir.infer_shapes(graphs.grouped_conv(kernel=3)))
    strict = PROFILES["tensorrt"].replace(grouped_min_kernel=5, grouped_channel_multiple=32)
    d = decision(annotate_graph(graph, strict, QuantConfig()), "conv")
    assert not d.quantized and d.reason.endswith(
        "INT8 pays only when out_channels % 32 == 0 and kernel >= 5"
    )
    lenient = PROFILES["tensorrt"].replace(grouped_min_kernel=1)
    graph = ir.Graph(ir.infer_shapes(graphs.grouped_conv(kernel=1)))
    assert decision(annotate_graph(graph, lenient, QuantConfig()), "conv").quantized


@pytest.mark.parametrize(
    ("builder", "backend", "expected"),
    [
        (graphs.conv_relu, "tensorrt", (1, 2)),
        (graphs.conv_relu, "onnxruntime", (0, 0)),  # output is the graph output: stays float
        (lambda: graphs.with_tail(graphs.conv_relu()), "onnxruntime", (2, 4)),  # + bias, + out
        (graphs.conv_small, "tensorrt", (0, 0)),
        (graphs.conv_transpose, "tensorrt", (1, 2)),
        # onnxruntime's CPU provider has no integer ConvTranspose: it stays float
        (lambda: graphs.with_tail(graphs.conv_transpose()), "onnxruntime", (0, 0)),
    ],
)
def test_conv_qdq_count(builder, backend, expected):
    assert qdq_counts(builder(), backend) == expected


def test_conv_qdq_wiring_tensorrt():
    out = onnxq.quantize(
        graphs.conv_relu(), graphs.random_batches(graphs.conv_relu(), 2), progress=False
    ).model
    g = ir.Graph(out)
    conv = g.node_by_name("conv")
    act_dq = g.producer[conv.input[0]]
    assert act_dq.op_type == "DequantizeLinear"
    act_q = g.producer[act_dq.input[0]]
    assert act_q.op_type == "QuantizeLinear" and act_q.input[0] == "x"
    w_dq = g.producer[conv.input[1]]
    assert w_dq.op_type == "DequantizeLinear"
    assert g.const_value(w_dq.input[0]).dtype.name == "int8"
    assert conv.input[2] == "conv.bias"  # TensorRT keeps a float bias


# ------------------------------------------------------------------------------- gemm
@pytest.mark.parametrize(("trans_b", "axis"), [(True, 0), (False, 1)])
def test_gemm_match_weight_axis_follows_transb(trans_b, axis):
    ann = annotated(graphs.gemm(trans_b=trans_b))
    assert kinds(ann) == {"x": ("activation", None), "gemm.weight": ("weight", axis)}
    assert decision(ann, "gemm").rule == "gemm"


def test_gemm_decline_non_constant_b():
    d = decision(annotated(graphs.gemm_act()), "gemm")
    assert not d.quantized and d.rule == "gemm"
    assert "B is not a constant matrix" in d.reason


def test_gemm_decline_small_output():
    d = decision(annotated(graphs.gemm(n=8)), "gemm")
    assert not d.quantized and "32 input / 8 output channels" in d.reason


@pytest.mark.parametrize(
    ("trans_b", "backend", "expected"),
    [
        (True, "tensorrt", (1, 2)),
        (False, "tensorrt", (1, 2)),
        (True, "onnxruntime", (1, 3)),
        (False, "onnxruntime", (1, 3)),
    ],
)
def test_gemm_qdq_count(trans_b, backend, expected):
    assert qdq_counts(graphs.gemm(trans_b=trans_b), backend) == expected


# ------------------------------------------------------------------------------- matmul
def test_matmul_match_const_kn_weight_axis_1():
    ann = annotated(graphs.matmul_const())
    assert kinds(ann) == {"x": ("activation", None), "matmul.weight": ("weight", 1)}


def test_matmul_decline_activation_times_activation():
    d = decision(annotated(graphs.matmul_act()), "matmul")
    assert not d.quantized and d.rule == "matmul"
    assert "activation x activation MatMul" in d.reason


def test_matmul_decline_vector_right_hand_side():
    d = decision(annotated(graphs.matmul_vector()), "matmul")
    assert not d.quantized and "GEMV" in d.reason


@pytest.mark.parametrize(
    ("builder", "backend", "expected"),
    [
        (graphs.matmul_const, "tensorrt", (1, 2)),
        # float output (the Relu after it is a graph output): MatMulIntegerToFloat
        (graphs.matmul_const, "onnxruntime", (1, 2)),
        (lambda: graphs.with_tail(graphs.matmul_const()), "onnxruntime", (2, 3)),
        (graphs.matmul_act, "tensorrt", (0, 0)),
        (graphs.matmul_act, "onnxruntime", (0, 0)),
    ],
)
def test_matmul_qdq_count(builder, backend, expected):
    assert qdq_counts(builder(), backend) == expected


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
