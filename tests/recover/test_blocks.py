"""Blocks found from the graph's cut points: residual blocks whole, chains grouped up to the
layer limit, ops no block holds cut them."""

from __future__ import annotations

from onnxq import ir
from onnxq.recover.blocks import find_blocks
from tests.graphs import residual_add
from tests.recover.builders import conv_chain, inverted_residual


def convs(graph: ir.Graph) -> dict[str, str]:
    return {n.name: n.input[1] for n in graph.nodes if n.op_type == "Conv"}


def test_an_inverted_residual_block_is_one_block_with_its_add():
    graph = ir.Graph(inverted_residual())
    weights = convs(graph)
    del weights["stem"]  # as placed: the 3-channel stem stays float
    blocks = find_blocks(graph, weights)
    assert [(b.input, b.output) for b in blocks] == [
        ("x", "b1.p"),
        ("b1.p", "b2.out"),
        ("sig", "y"),  # the Sigmoid is in no block; the head conv after it is one alone
    ]
    assert blocks[1].nodes == (
        "b2.expand", "b2.c1", "b2.depthwise", "b2.c2", "b2.project", "b2.add",
    )  # fmt: skip
    assert blocks[1].weights == ("b2.ew", "b2.dw", "b2.pw")
    assert "stem" in blocks[0].nodes and "stem.w" not in blocks[0].weights


def test_a_residual_segment_is_never_split():
    graph = ir.Graph(inverted_residual())
    blocks = find_blocks(graph, convs(graph), max_layers=2)  # b2's segment holds three
    assert ("b1.p", "b2.out") in [(b.input, b.output) for b in blocks]
    graph = ir.Graph(residual_add())
    blocks = find_blocks(graph, convs(graph), max_layers=1)
    assert [(b.nodes, b.output) for b in blocks] == [
        (("conv1", "relu1"), "skip"),
        (("conv2", "add"), "y"),
    ]


def test_a_chain_is_grouped_up_to_the_layer_limit():
    graph = ir.Graph(conv_chain())
    assert [b.weights for b in find_blocks(graph, convs(graph))] == [("w1", "w2", "w3")]
    two = find_blocks(graph, convs(graph), max_layers=2)
    assert [b.weights for b in two] == [("w1", "w2"), ("w3",)]
    assert two[0].output == two[1].input == "r2"


def test_a_block_without_a_layer_to_learn_is_left_out():
    graph = ir.Graph(conv_chain())
    assert find_blocks(graph, {}) == []
