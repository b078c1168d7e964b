"""The data-driven exclusions are values: each fires past its option's threshold and not before,
they run in order, and a shared-scale node is recognised by its rule's flag, not its name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.config.placement import PlacementOptions
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.annotations import Annotations, Decision, Excluded, TensorAnnotation
from onnxq.place.exclusions import (
    EXCLUSIONS,
    Evidence,
    NodeExclusion,
    TensorExclusion,
    find_exclusions,
)
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.sets import RULE_SETS
from tests import graphs


def stats_of(name: str, values: np.ndarray, **kind: bool) -> TensorStats:
    s = TensorStats(name, **kind)
    s.update(np.asarray(values, np.float32))
    return s


def facts_of(model) -> GraphFacts:
    return GraphFacts.of(ir.Graph(ir.infer_shapes(model)), PROFILES["onnxruntime"])


def activation(name: str) -> TensorAnnotation:
    return TensorAnnotation(name, "activation", [])


def run(annotations: Annotations, stats: dict, facts: GraphFacts, **options) -> Excluded:
    return find_exclusions(annotations, Evidence(stats, facts), QuantConfig(**options).placement)


def test_every_exclusion_names_a_placement_option_and_they_are_ordered_values():
    fields = {f.name for f in dataclasses.fields(PlacementOptions)}
    assert [e.name for e in EXCLUSIONS] == [
        "mask_range",
        "shared_scale_ranges",
        "weak_channels",
        "weak_positions",
    ]
    assert all(e.option in fields for e in EXCLUSIONS)
    assert isinstance(EXCLUSIONS[0], TensorExclusion)
    assert all(isinstance(e, NodeExclusion) for e in EXCLUSIONS[1:])


def test_a_tensor_that_reaches_the_mask_threshold_stays_float():
    facts = facts_of(graphs.conv_relu())
    ann = Annotations({"x": activation("x")}, [])
    loud = {"x": stats_of("x", np.array([[-1e4, 3.0]]))}
    found = run(ann, loud, facts)
    assert found.tensors["x"].startswith("tensor 'x' reaches |x| = 1e+04 (>= 10000)")
    assert not run(ann, loud, facts, mask_threshold=2e4)  # the option moves the threshold
    assert not run(ann, {"x": stats_of("x", np.array([[-9999.0, 3.0]]))}, facts)
    assert not run(ann, {}, facts)  # a tensor without statistics is not judged


def concat_decision(rule: str, shares_scale: bool) -> Decision:
    return Decision("cat", "Concat", True, rule, tensors=("a", "b"), shares_scale=shares_scale)


def test_inputs_of_a_shared_scale_whose_ranges_differ_keep_the_node_float():
    facts = facts_of(graphs.concat())
    stats = {"a": stats_of("a", np.array([[-1.0, 1.0]])), "b": stats_of("b", np.array([[90.0]]))}
    found = run(Annotations({}, [concat_decision("concat", True)]), stats, facts)
    assert found.nodes == {
        "cat": "its inputs' ranges differ 90x (> 8x); one shared scale would crush the small "
        "ones, so it stays float"
    }
    ann = Annotations({}, [concat_decision("concat", True)])
    assert not run(ann, stats, facts, concat_range_ratio=100.0)


def test_a_shared_scale_is_known_by_the_rules_flag_not_its_name():
    facts = facts_of(graphs.concat())
    stats = {"a": stats_of("a", np.array([[1.0]])), "b": stats_of("b", np.array([[90.0]]))}
    renamed = Annotations({}, [concat_decision("joined", True)])
    assert run(renamed, stats, facts).nodes.keys() == {"cat"}
    unflagged = Annotations({}, [concat_decision("concat", False)])
    assert not run(unflagged, stats, facts)
    (concat_rule,) = [r for r in RULE_SETS["onnxruntime"] if r.name == "concat"]
    assert concat_rule.shares_scale
    assert not any(r.shares_scale for r in RULE_SETS["onnxruntime"] if r is not concat_rule)


def grouped_input_stats(weak: int, channels: int = 8) -> TensorStats:
    peaks = np.ones(channels, np.float32)
    peaks[:weak] = 0.01
    values = np.broadcast_to(peaks[None, :, None, None], (1, channels, 2, 2))
    return stats_of("x", values, channels=True)


def test_a_grouped_conv_whose_input_channels_are_mostly_weak_stays_float():
    model = graphs.grouped_conv(kernel=3)
    facts = facts_of(model)
    (conv,) = facts.grouped_convs
    tensor = facts.grouped_convs[conv]
    decision = Decision(conv, "Conv", True, "conv", tensors=(tensor,))
    ann = Annotations({}, [decision])
    stats = {tensor: grouped_input_stats(weak=3)}  # 3 of 8 > 0.25
    assert (
        run(ann, stats, facts)
        .nodes[conv]
        .startswith(
            "3 of its input's 8 channels peak below 1/16 of the tensor's peak "
            "(> weak_channel_fraction=0.25)"
        )
    )
    assert not run(ann, {tensor: grouped_input_stats(weak=2)}, facts)  # 2 of 8: not more
    assert not run(ann, stats, facts, weak_channel_fraction=0.5)
    float_decision = dataclasses.replace(decision, quantized=False)
    assert not run(Annotations({}, [float_decision]), stats, facts)  # float already


def test_quiet_frames_before_a_layer_norm_keep_the_conv_float():
    facts = facts_of(graphs.feature_encoder())
    tensor = facts.position_norm_convs["conv1"]
    frames = np.ones((1, 4, 16), np.float32)
    frames[:, :, :8] = 0.01  # half the frames far below the loud ones
    stats = {tensor: stats_of(tensor, frames, positions=True)}
    ann = Annotations({}, [Decision("conv1", "Conv", True, "conv", tensors=(tensor,))])
    found = run(ann, stats, facts)
    assert found.nodes["conv1"].startswith("8 of its input's 16 positions (frames) peak below")
    assert not run(ann, stats, facts, weak_position_fraction=1.0)


def test_a_later_exclusion_gives_the_reason_for_a_node_two_of_them_name():
    def first(d: Decision, threshold: float, evidence: Evidence) -> str | None:
        return "first"

    def second(d: Decision, threshold: float, evidence: Evidence) -> str | None:
        return "second"

    ann = Annotations({}, [Decision("n", "Conv", True, "conv")])
    facts = facts_of(graphs.conv_relu())
    both = (
        NodeExclusion("a", "concat_range_ratio", first),
        NodeExclusion("b", "weak_channel_fraction", second),
    )
    found = find_exclusions(ann, Evidence({}, facts), QuantConfig().placement, both)
    assert found.nodes == {"n": "second"}


def test_excluded_merges_and_says_whether_it_adds_anything():
    known = Excluded({"a": "1"}, {"n": "2"})
    assert not Excluded({"a": "other reason"}).adds_to(known)
    assert Excluded(nodes={"m": "3"}).adds_to(known)
    merged = known | Excluded({"a": "new", "b": "4"})
    assert merged.tensors == {"a": "new", "b": "4"} and merged.nodes == {"n": "2"}
    with pytest.raises(TypeError):
        merged.tensors["c"] = "5"  # type: ignore[index]
