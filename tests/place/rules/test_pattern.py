"""The rule vocabulary: rules are values, claims and declines are values, matches read the
graph, and the context shows rules the placement so far without letting them change it."""

from __future__ import annotations

import dataclasses

import pytest

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.pattern import Claim, Context, Decline, Match, Rule, Spec, claim, rule
from tests import graphs


def test_rule_decorator_builds_a_rule_value_with_its_docstring():
    @rule("negate", "Neg", "Abs")
    def negate(m: Match, ctx: Context):
        """Quantize the input of Neg/Abs."""
        return claim(Spec(m.input(0), "activation", ((m.name, 0),)))

    assert isinstance(negate, Rule)
    assert negate.name == "negate" and negate.op_types == frozenset({"Neg", "Abs"})
    assert negate.doc == "Quantize the input of Neg/Abs."
    assert not negate.shares_scale


def test_a_rule_can_anchor_on_an_op_list_of_the_profile():
    @rule("kernels", "Neg", profile_ops=lambda profile: profile.unary_kernel_ops)
    def kernels(m: Match, ctx: Context):
        return Decline("test")

    assert (
        kernels.anchors(PROFILES["onnxruntime"])
        == {"Neg"} | PROFILES["onnxruntime"].unary_kernel_ops
    )
    assert kernels.anchors(PROFILES["tensorrt"]) == {"Neg"}


def test_match_reads_inputs_and_attributes():
    graph = ir.Graph(graphs.gemm(trans_b=True))
    m = Match(graph.node_by_name("gemm"), graph)
    assert m.name == "gemm"
    assert m.input(0) == "x" and m.input(2) == "gemm.bias" and m.input(5) == ""
    assert m.attrs() == {"transB": 1}


def context(profile_name: str, **options) -> Context:
    graph = ir.Graph(graphs.conv_relu())
    profile = PROFILES[profile_name]
    facts = GraphFacts.of(graph, profile)
    return Context(profile, QuantConfig(**options).placement, facts, {}, {}, set(), {})


def test_context_min_channels_prefers_the_config():
    assert context("tensorrt").min_channels == 16
    assert context("tensorrt", min_channels=0).min_channels == 0
    assert context("onnxruntime").min_channels == 0


def test_the_context_is_frozen():
    ctx = context("tensorrt")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.claimed = {"conv"}  # type: ignore[misc]


def test_specs_claims_and_declines_are_frozen_values():
    spec = Spec("w", "weight", (("conv", 1),), axis=0)
    assert spec == Spec("w", "weight", (("conv", 1),), axis=0)
    assert hash(Decline("too small")) == hash(Decline("too small"))
    both = claim(spec) + Claim((), ("relu",))
    assert both == Claim((spec,), ("relu",)) and hash(both) == hash(Claim((spec,), ("relu",)))
    assert not Claim() and claim(spec)
