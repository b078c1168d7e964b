"""Graph facts: computed once, looked up by name: shape paths, heads, position-normalised
convs, where readers saturate."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.place.facts import GraphFacts
from onnxq.place.heads import head_nodes
from onnxq.place.paths import gated_products, position_norm_convs, shape_path
from tests import graphs


def facts_of(graph: ir.Graph, backend: str = "tensorrt") -> GraphFacts:
    return GraphFacts.of(graph, PROFILES[backend])


def test_shape_path_follows_shape_ops_and_stops_at_data():
    model = ir.infer_shapes(graphs.shape_subgraph())
    path = shape_path(ir.Graph(model), PROFILES["tensorrt"])
    assert path == {"x_shape", "batch", "new_shape"}


def test_heads_are_the_weighted_ops_an_output_is_read_from_without_mixing():
    graph = ir.Graph(ir.infer_shapes(graphs.two_head_detector()))
    assert head_nodes(graph) == frozenset({"cls", "box"})  # not body; not mixed (an Add)


def test_position_norm_convs_are_the_1d_convs_a_layer_norm_reads_through_pointwise_ops():
    def found(model):
        return position_norm_convs(ir.Graph(ir.infer_shapes(model)))

    assert found(graphs.feature_encoder()) == {"conv0": "x", "conv1": "r0", "conv2": "r1"}
    # a normalisation on the way resets the question: the first conv is not found
    assert found(graphs.feature_encoder(norm_after_first=True)) == {"conv1": "n0", "conv2": "r1"}
    assert found(graphs.grouped_conv()) == {}  # 2-D convs, no LayerNormalization


def test_saturation_bounds_are_where_every_quantized_reader_stops_changing():
    def bounds(op: str) -> tuple[float, float] | None:
        graph = ir.Graph(ir.infer_shapes(graphs.conv_hardswish(op)))
        readers = [(n.name, list(n.input).index("c1_out")) for n, _ in graph.consumers["c1_out"]]
        return facts_of(graph).saturation_bounds(readers)

    # x * HardSigmoid(x, 1/6, 1/2): 0 below -3 (-0.5 / float32(1/6))
    assert bounds("pair") == pytest.approx((-3.0, float("inf")))
    assert bounds("HardSwish") == (-3.0, float("inf"))
    assert bounds("Relu") == (0.0, float("inf"))
    assert bounds("Sigmoid") is None  # never exactly constant
    graph = ir.Graph(ir.infer_shapes(graphs.conv_hardswish("pair")))
    facts = facts_of(graph)
    assert facts.saturation_bounds([("gate", 0)]) == pytest.approx((-3.0, 3.0))
    # a reader without a bound (the next conv reading the same tensor) lifts it
    assert facts.saturation_bounds([("gate", 0), ("c2", 0)]) is None


def test_a_clip_reader_bounds_both_sides():
    m = graphs.conv_hardswish("Relu")
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    relu.op_type = "Clip"
    relu.input.extend(["lo", "hi"])
    m.graph.initializer.extend(
        [
            helper.make_tensor("lo", onnx.TensorProto.FLOAT, [], [-1.0]),
            helper.make_tensor("hi", onnx.TensorProto.FLOAT, [], [6.0]),
        ]
    )
    graph = ir.Graph(ir.infer_shapes(m))
    assert facts_of(graph).saturation_bounds([("act", 0)]) == (-1.0, 6.0)


def test_facts_are_a_frozen_value_indexed_by_name():
    graph = ir.Graph(ir.infer_shapes(graphs.two_head_detector()))
    facts = facts_of(graph)
    assert facts.nodes["cls"].op_type == "Conv" and set(facts.nodes) == {
        n.name for n in graph.nodes
    }
    assert facts.heads == {"cls", "box"} and facts.score_maps == ("y",)
    with pytest.raises(TypeError):
        facts.nodes["new"] = facts.nodes["cls"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        facts.heads = frozenset()  # type: ignore[misc]
    # a profile without a head method has no heads to look for
    no_heads = PROFILES["tensorrt"].replace(head_method=None)
    plain = GraphFacts.of(graph, no_heads)
    assert plain.heads == frozenset() and plain.score_maps == ()


def test_reader_bounds_are_indexed_by_reader_and_input():
    graph = ir.Graph(ir.infer_shapes(graphs.conv_hardswish("HardSwish")))
    bounds = facts_of(graph).reader_bounds
    (reader,) = [(n.name, i) for n, i in graph.consumers["c1_out"] if n.op_type == "HardSwish"]
    assert bounds[reader] == (-3.0, float("inf"))
    assert all(
        graph.nodes[[n.name for n in graph.nodes].index(name)].op_type != "Conv"
        for name, _ in bounds
    )


def test_gated_products_are_muls_of_two_unbounded_activations():
    # SwiGLU's SiLU(g) * u is gated; SiLU itself (g * Sigmoid(g)) and a product with a
    # shifted, scaled Erf (GELU) are not; nor is a product with a constant
    r = graphs.rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "wg"], ["g"], name="gate"),
        helper.make_node("MatMul", ["x", "wu"], ["u"], name="up"),
        helper.make_node("Sigmoid", ["g"], ["sg"], name="sigmoid"),
        helper.make_node("Mul", ["g", "sg"], ["silu"], name="silu"),
        helper.make_node("Mul", ["silu", "u"], ["glu"], name="glu"),
        helper.make_node("Erf", ["u"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="shift"),
        helper.make_node("Mul", ["u", "e1"], ["gelu"], name="gelu"),
        helper.make_node("Mul", ["u", "one"], ["scaled"], name="scale"),
        helper.make_node("Sum", ["glu", "gelu", "scaled"], ["y"], name="sum"),
    ]
    inits = [
        graphs.init("wg", graphs.weight(r, 16, 16)),
        graphs.init("wu", graphs.weight(r, 16, 16)),
        graphs.init("one", graphs.weight(r, 1)),
    ]
    model = graphs.model(nodes, [graphs.tensor("x", [2, 16])], [graphs.tensor("y", [2, 16])], inits)
    graph = ir.Graph(ir.infer_shapes(model))
    assert gated_products(graph) == {"glu"}
    assert facts_of(graph).gated_products == {"glu"}
