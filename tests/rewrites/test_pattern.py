"""The rule vocabulary: rules are values, declines carry reasons, matches read the graph."""

from __future__ import annotations

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.rewrites.pattern import Context, Decline, Match, Rule, Spec, rule
from tests import graphs


def test_rule_decorator_builds_a_rule_value_with_its_docstring():
    @rule("negate", "Neg", "Abs")
    def negate(m: Match, ctx: Context):
        """Quantize the input of Neg/Abs."""
        return [Spec(m.input(0), "activation", ((m.name, 0),))]

    assert isinstance(negate, Rule)
    assert negate.name == "negate" and negate.op_types == frozenset({"Neg", "Abs"})
    assert negate.doc == "Quantize the input of Neg/Abs."


def test_match_reads_inputs_and_attributes():
    graph = ir.Graph(graphs.gemm(trans_b=True))
    m = Match(graph.node_by_name("gemm"), graph)
    assert m.name == "gemm"
    assert m.input(0) == "x" and m.input(2) == "gemm.bias" and m.input(5) == ""
    assert m.attrs() == {"transB": 1}


def test_context_min_channels_prefers_the_config():
    graph = ir.Graph(graphs.conv_relu())
    trt = PROFILES["tensorrt"]
    assert Context(trt, QuantConfig(), graph).min_channels == 16
    assert Context(trt, QuantConfig(min_channels=0), graph).min_channels == 0
    assert Context(PROFILES["onnxruntime"], QuantConfig(), graph).min_channels == 0


def test_specs_and_declines_are_frozen_values():
    spec = Spec("w", "weight", (("conv", 1),), axis=0)
    assert spec == Spec("w", "weight", (("conv", 1),), axis=0)
    assert hash(Decline("too small")) == hash(Decline("too small"))
