"""The rule engine: one decision per node, merged tensor specs, exclusions and overrides."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import Override, QuantConfig
from onnxq.place.annotations import Annotations
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from onnxq.place.heads import head_nodes, score_maps
from tests import graphs
from tests.placement import annotated


def reasons(ann: Annotations) -> dict[str, str]:
    return {d.node: d.reason for d in ann.decisions}


def test_every_node_gets_exactly_one_decision_in_graph_order():
    # the top-level graph's nodes, then each control-flow body's (if_model's branches)
    for backend in ("tensorrt", "onnxruntime"):
        for name, builder in graphs.BUILDERS.items():
            model = builder()
            ann = annotated(model, backend)
            nodes = [n.name for scope in ir.scopes(ir.Graph(model)) for n in scope.nodes]
            assert [d.node for d in ann.decisions] == nodes, name
            for d in ann.decisions:
                assert d.quantized or d.reason, (name, d)


def test_annotation_does_not_edit_the_graph():
    model = ir.infer_shapes(graphs.residual_add())
    before = ir.serialize(model)
    profile = PROFILES["onnxruntime"]
    facts = GraphFacts.of(ir.Graph(model), profile)
    annotate(facts, profile, QuantConfig(backend="onnxruntime").placement)
    assert ir.serialize(model) == before


def test_tensors_are_listed_in_graph_order_and_filtered_by_kind():
    ann = annotated(graphs.residual_add())
    assert list(ann.tensors) == ["x", "conv1.weight", "skip", "conv2.weight"]
    assert [t.tensor for t in ann.of_kind("weight")] == ["conv1.weight", "conv2.weight"]
    assert [t.tensor for t in ann.of_kind("activation")] == ["x", "skip"]
    assert ann.of_kind("bias") == []


def test_exclude_glob_keeps_matching_nodes_float():
    ann = annotated(graphs.residual_add(), exclude=("conv*",))
    r = reasons(ann)
    assert r["conv1"] == "excluded by --exclude conv*"
    assert r["conv2"] == "excluded by --exclude conv*"
    assert ann.tensors == {}


def test_override_exclude_by_op_type_and_by_tensor():
    cfg_op = (Override(op_type="Conv", exclude=True),)
    ann = annotated(graphs.conv_relu(), overrides=cfg_op)
    assert reasons(ann)["conv"] == "excluded by override (op_type=Conv) exclude"
    ann = annotated(graphs.conv_relu(), overrides=(Override(tensor="x", exclude=True),))
    d = next(d for d in ann.decisions if d.node == "conv")
    assert not d.quantized and d.reason == "tensor 'x' excluded by override (tensor=x) exclude"


def test_method_comes_from_the_config_and_the_last_matching_override():
    ann = annotated(graphs.residual_add(), method="entropy")
    assert {t.tensor: t.method for t in ann.of_kind("activation")} == {
        "x": "entropy",
        "skip": "entropy",
    }
    overrides = (Override(node="conv2", method="mse"), Override(tensor="skip", method="minmax"))
    ann = annotated(graphs.residual_add(), overrides=overrides)
    assert {t.tensor: t.method for t in ann.of_kind("activation")} == {
        "x": "auto",
        "skip": "minmax",
    }


def test_conflicting_specs_decline_the_second_rule_with_a_reason():
    ann = annotated(graphs.shared_weight())
    r = reasons(ann)
    assert r["conv"] == ""
    assert r["convt"] == (
        "tensor 'shared.weight' is already quantized as weight (axis 0) by "
        "conv; a second, different spec would clash"
    )
    assert ann.tensors["shared.weight"].consumers == [("conv", 1)]
    assert "conv_out" not in ann.tensors  # the declined rule left nothing behind


def test_custom_domain_ops_stay_float():
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Gelu", ["c"], ["y"], name="gelu", domain="com.example"),
    ]
    base = graphs.conv_relu()
    graph = helper.make_graph(
        nodes, "custom", base.graph.input, base.graph.output, [base.graph.initializer[0]]
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", graphs.OPSET),
            helper.make_opsetid("com.example", 1),
        ],
    )
    ann = annotated(model)
    assert reasons(ann)["gelu"] == "custom-domain op (com.example) stays float"
    assert ann.tensors["conv.weight"].axis == 0


def test_float_data_from_the_shape_alone_is_not_called_a_shape_computation():
    # an RNN's zero initial state: ConstantOfShape(Shape(x)) -> MatMul (recurrent weight)
    # -> Add with the data path
    r = graphs.rng(3)
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node(
            "ConstantOfShape",
            ["xs"],
            ["h0"],
            name="zeros",
            value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)),
        ),
        helper.make_node("MatMul", ["h0", "wr"], ["rec"], name="recurrent"),
        helper.make_node("MatMul", ["x", "wi"], ["inp"], name="input_proj"),
        helper.make_node("Add", ["inp", "rec"], ["y"], name="add"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", [4, 32])],
        [graphs.tensor("y", [4, 32])],
        [graphs.init("wr", graphs.weight(r, 32, 32)), graphs.init("wi", graphs.weight(r, 32, 32))],
    )
    why = reasons(annotated(model))
    assert why["shape"] == "shape/index computation: never quantized"
    for node in ("zeros", "recurrent"):
        assert why[node] == (
            "computed from constants and the input's shape alone, not from its "
            "values (e.g. a zero initial state, or a position embedding resized "
            "to the input): never quantized"
        )
    assert "shape/index" not in why.get("add", "")


def test_fused_relu_is_reported_as_folded_into_its_producer():
    ann = annotated(graphs.residual_add(), "onnxruntime")
    relu = next(d for d in ann.decisions if d.node == "relu1")
    assert relu.quantized and relu.rule == "fused"
    assert relu.reason == "folded into conv1's output quantization"
    assert ann.tensors["skip"].consumers == [("conv2", 0), ("add", 1)]


def test_auto_means_minmax_for_the_inputs_of_heads():
    model = graphs.two_head_detector(
        squash="Softmax"
    )  # scores over classes: no per-element score map
    ann = annotated(model)
    assert ann.tensors["br"].method == "minmax"  # read by the heads cls and box
    assert ann.tensors["x"].method == "auto"  # the body's input
    assert ann.notes == []
    # an explicit method is kept
    assert annotated(model, method="percentile").tensors["br"].method == "percentile"


def test_auto_means_minmax_everywhere_for_per_element_sigmoid_scores():
    model = graphs.two_head_detector()
    assert score_maps(ir.Graph(ir.infer_shapes(model))) == ["y"]  # not z: no sigmoid
    ann = annotated(model)
    assert {t.method for t in ann.of_kind("activation")} == {"minmax"}
    assert ann.notes and ann.notes[0].startswith("output 'y' holds per-element sigmoid scores")
    assert ann.score_map_method == "minmax"  # the report's hint reads it
    assert {t.method for t in annotated(model, method="mse").of_kind("activation")} == {"mse"}
    no_map = annotated(graphs.two_head_detector(squash="Softmax"))
    assert no_map.score_map_method is None
    per_tensor = annotated(model, score_map_ranges="auto")  # as for any other model
    assert per_tensor.score_map_method is None and not per_tensor.notes
    assert {t.method for t in per_tensor.of_kind("activation")} != {"minmax"}


def test_a_score_map_upsampled_before_its_sigmoid_is_a_score_map():
    # a saliency/segmentation head: Conv -> Resize (to the input's size) -> Sigmoid
    r = graphs.rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["f"], name="body", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["f"], ["fr"], name="relu"),
        helper.make_node("Conv", ["fr", "w2"], ["logit"], name="head"),
        helper.make_node("Resize", ["logit", "", "scales"], ["up"], name="up", mode="linear"),
        helper.make_node("Sigmoid", ["up"], ["y"], name="sigmoid"),
    ]
    inits = [
        graphs.init("w1", graphs.weight(r, 16, 16, 3, 3)),
        graphs.init("w2", graphs.weight(r, 16, 16, 1, 1)),
        graphs.init("scales", np.array([1, 1, 2, 2], dtype=np.float32)),
    ]
    model = graphs.model(
        nodes, [graphs.tensor("x", [1, 16, 8, 8])], [graphs.tensor("y", [1, 16, 16, 16])], inits
    )
    graph = ir.Graph(ir.infer_shapes(model))
    assert head_nodes(graph) == frozenset({"head"}) and score_maps(graph) == ["y"]
    assert {t.method for t in annotated(model).of_kind("activation")} == {"minmax"}


def test_the_path_into_a_logarithm_stays_float_and_the_layers_after_it_do_not():
    for backend in ("tensorrt", "onnxruntime"):
        ann = annotated(graphs.with_tail(graphs.spectrogram()), backend)
        decided = {d.node: d for d in ann.decisions}
        for node in ("stft_re", "stft_im", "re_sq", "im_sq", "power", "power_t", "mel", "floor"):
            assert not decided[node].quantized, (backend, node)
            assert "reaches the logarithm 'log'" in decided[node].reason, (backend, node)
        assert decided["conv"].quantized, backend
        assert "re" not in ann.tensors and "mel" not in ann.tensors


def test_the_walk_up_from_a_logarithm_stops_at_an_activation():
    conv1 = graphs.conv_relu()  # x -> conv -> relu -> y
    nodes = [
        *conv1.graph.node,
        helper.make_node("Conv", ["y", "conv2.weight"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Abs", ["c2"], ["mag"], name="abs"),
        helper.make_node("Log", ["mag"], ["out"], name="log"),
    ]
    inits = [
        *conv1.graph.initializer,
        graphs.init("conv2.weight", graphs.weight(graphs.rng(1), 16, 16, 3, 3)),
    ]
    model = graphs.model(
        nodes, list(conv1.graph.input), [graphs.tensor("out", [1, 16, 8, 8])], inits
    )
    r = reasons(annotated(model))
    assert "logarithm" in r["conv2"] and "logarithm" in r["abs"]
    assert r["conv"] == "" and "logarithm" not in r["relu"]


def test_the_linear_ops_in_front_of_a_tree_ensemble_stay_float():
    # a tree compares each feature with split thresholds: one int8 step flips decisions
    for backend in ("tensorrt", "onnxruntime"):
        r = reasons(annotated(graphs.tabular(trees=True), backend))
        assert "split thresholds of the tree ensemble 'forest'" in r["pca"], backend
        assert "ONNX-ML op" in r["forest"]
    # the same projection in front of an MLP is quantized (TensorRT; the onnxruntime profile
    # finds it too small to pay)
    decided = {d.node: d for d in annotated(graphs.tabular(), "tensorrt").decisions}
    assert decided["pca"].quantized and decided["out"].quantized is False  # 4 outputs < 16


def test_a_residual_add_of_a_dynamic_width_model_is_quantized():
    model = graphs.residual_add()
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[3].dim_param = "W"  # the inferred widths get fresh names
    add = next(d for d in annotated(model).decisions if d.node == "add")
    assert add.quantized and add.rule == "residual_add", add.reason


def test_the_onnxruntime_profile_bounds_a_conv_output_read_by_a_hardswish():
    ann = annotated(graphs.conv_hardswish("pair"), "onnxruntime")
    assert ann.tensors["c1_out"].bounds == pytest.approx((-3.0, float("inf")))
    assert annotated(graphs.conv_hardswish("pair")).tensors["act"].bounds is None


# ----------------------------------------------------------- claims are applied only on success
def _sigmoid_conv_relu() -> onnx.ModelProto:
    """x -> Sigmoid -> s -> Conv -> c -> Relu -> y."""
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
        helper.make_node("Conv", ["s", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    w = graphs.init("w", graphs.weight(graphs.rng(0), 16, 16, 3, 3))
    shape = [1, 16, 8, 8]
    return graphs.model(nodes, [graphs.tensor("x", shape)], [graphs.tensor("y", shape)], [w])


def test_a_claim_that_clashes_leaves_nothing_behind_and_the_next_rule_is_asked(monkeypatch):
    from onnxq.place.rules.pattern import Claim, Spec, rule
    from onnxq.place.rules.sets import RULE_SETS

    @rule("odd_sigmoid", "Sigmoid")
    def odd_sigmoid(m, ctx):
        return Claim((Spec("s", "weight", (("conv", 0),), axis=0),))

    @rule("greedy_conv", "Conv")
    def greedy_conv(m, ctx):  # reads s as an activation (a clash) and folds the relu in
        return Claim((Spec("s", "activation", (("conv", 0),)),), folded=("relu",))

    @rule("plain_conv", "Conv")
    def plain_conv(m, ctx):
        return Claim((Spec("w", "weight", (("conv", 1),), axis=0),))

    monkeypatch.setitem(RULE_SETS, "tensorrt", (odd_sigmoid, greedy_conv, plain_conv))
    decided = {d.node: d for d in annotated(_sigmoid_conv_relu()).decisions}
    assert decided["conv"].quantized and decided["conv"].rule == "plain_conv"
    # the clashing claim's folded Relu was not taken: the Relu is decided on its own
    assert not decided["relu"].quantized
    assert decided["relu"].reason == "no tensorrt rule quantizes Relu: it stays float"

    monkeypatch.setitem(RULE_SETS, "tensorrt", (odd_sigmoid, greedy_conv))
    decided = {d.node: d for d in annotated(_sigmoid_conv_relu()).decisions}
    assert not decided["conv"].quantized and decided["conv"].rule == "greedy_conv"
    assert decided["conv"].reason.startswith("tensor 's' is already quantized as weight (axis 0)")
    assert not decided["relu"].quantized


def test_a_successful_claim_takes_its_folded_nodes(monkeypatch):
    from onnxq.place.rules.pattern import Claim, Spec, rule
    from onnxq.place.rules.sets import RULE_SETS

    @rule("folding_conv", "Conv")
    def folding_conv(m, ctx):
        return Claim((Spec("s", "activation", (("conv", 0),)),), folded=("relu",))

    monkeypatch.setitem(RULE_SETS, "tensorrt", (folding_conv,))
    decided = {d.node: d for d in annotated(_sigmoid_conv_relu()).decisions}
    assert decided["conv"].quantized and decided["relu"].quantized
    assert decided["relu"].rule == "fused"
    assert decided["relu"].reason == "folded into conv's output quantization"
