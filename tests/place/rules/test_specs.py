"""onnxq.place.rules.specs: the specs a rule gives a node's tensors, and why a tensor has none."""

from __future__ import annotations

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.pattern import Context, Match
from onnxq.place.rules.specs import activation, activation_problem, output_problem, weight_spec
from tests import graphs


def _conv() -> tuple[Match, Context]:
    graph = ir.Graph(ir.infer_shapes(graphs.conv_relu()))
    profile = PROFILES["tensorrt"]
    facts = GraphFacts.of(graph, profile)
    options = QuantConfig(backend="tensorrt").placement
    ctx = Context(profile, options, facts, {}, {}, frozenset(), {})
    (conv,) = [n for n in graph.nodes if n.op_type == "Conv"]
    return Match(conv, graph), ctx


def test_the_input_is_an_activation_and_the_weight_is_per_output_channel():
    m, ctx = _conv()
    assert activation_problem(m, ctx, m.input(0)) is None
    assert activation(m, 0).consumers == ((m.name, 0),)
    w = weight_spec(m, ctx, 1)
    assert w.kind == "weight" and w.axis == 0


def test_a_constant_is_no_activation_and_a_graph_output_gets_no_qdq():
    m, ctx = _conv()
    assert activation_problem(m, ctx, m.input(1)) == (
        f"input {m.input(1)!r} is a constant, not an activation"
    )
    assert activation_problem(m, ctx, "") == "the input is missing"
    out = ctx.graph.graph_outputs[0]
    assert output_problem(m, ctx, out) == f"its output {out!r} is a graph output (never quantized)"
