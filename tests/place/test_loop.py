"""The placement loop, driven by fake measures: it settles when the data keeps nothing more
float, never returns a tensor without statistics, and past its cap raises InternalError."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.errors import InternalError
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import place
from tests import graphs


def conv_chain(layers: int) -> onnx.ModelProto:
    """x -> (Conv -> Relu) x ``layers`` -> y: TensorRT quantizes each conv's input."""
    r = graphs.rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(graphs.init(f"w{i}", graphs.weight(r, 16, 16, 3, 3)))
        nodes.append(
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1] * 4)
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    return graphs.model(
        nodes, [graphs.tensor("x", [1, 16, 8, 8])], [graphs.tensor(x, [1, 16, 8, 8])], inits
    )


def stats_of(name: str, peak: float) -> TensorStats:
    s = TensorStats(name)
    s.update(np.array([[-peak, peak]], np.float32))
    return s


@dataclass
class Measured:
    stats: dict[str, TensorStats]
    unobservable: dict[str, str] = field(default_factory=dict)
    body_runs: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeMeasure:
    """Statistics of peak 1 for every wanted tensor, except the first ``loud`` tensors of each
    call, which reach 1e5 (past mask_threshold): each call keeps new tensors float."""

    loud: int = 0
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, wanted: Mapping[str, bool]) -> Measured:
        self.calls.append(list(wanted))
        names = list(wanted)
        return Measured(
            {t: stats_of(t, 1e5 if i < self.loud else 1.0) for i, t in enumerate(names)}
        )


def setup(layers: int = 4) -> tuple[GraphFacts, QuantConfig]:
    graph = ir.Graph(ir.infer_shapes(conv_chain(layers)))
    return GraphFacts.of(graph, PROFILES["tensorrt"]), QuantConfig()


def test_quiet_data_settles_in_one_round_with_every_tensor_observed():
    facts, cfg = setup()
    measure = FakeMeasure()
    placement = place(facts, PROFILES["tensorrt"], cfg.placement, measure)
    assert placement.rounds == 1 and measure.calls == [["x", "r0", "r1", "r2"]]
    assert set(placement.annotations.tensors) >= {"x", "r0", "r1", "r2"}
    assert placement.statistics.stats.keys() == {"x", "r0", "r1", "r2"}


def test_a_loud_tensor_is_kept_float_and_the_loop_settles_on_the_next_round():
    facts, cfg = setup()

    def measure(wanted: Mapping[str, bool]) -> Measured:
        return Measured({t: stats_of(t, 1e5 if t == "r1" else 1.0) for t in wanted})

    placement = place(facts, PROFILES["tensorrt"], cfg.placement, measure)
    assert placement.rounds == 2
    conv2 = next(d for d in placement.annotations.decisions if d.node == "conv2")
    assert not conv2.quantized and conv2.reason.startswith("tensor 'r1' reaches |x| = 1e+05")
    assert "r1" not in placement.annotations.tensors


def test_exclusions_that_keep_coming_settle_within_the_cap():
    facts, cfg = setup(layers=4)
    measure = FakeMeasure(loud=1)  # each round, the first quantized input turns out loud
    placement = place(facts, PROFILES["tensorrt"], cfg.placement, measure, max_rounds=5)
    assert [len(c) for c in measure.calls] == [4, 3, 2, 1, 0]
    assert placement.rounds == 5 and not placement.annotations.of_kind("activation")


def test_past_the_cap_the_loop_raises_an_internal_error_naming_what_kept_changing():
    facts, cfg = setup(layers=4)
    with pytest.raises(InternalError) as caught:
        place(facts, PROFILES["tensorrt"], cfg.placement, FakeMeasure(loud=1), max_rounds=3)
    message = str(caught.value)
    assert message.startswith("placement did not settle in 3 rounds")
    assert "the last 1: 'r1'" in message and "this is a bug in onnxq" in message


def test_tensors_the_measure_cannot_observe_stay_float_with_its_reason():
    facts, cfg = setup()

    def measure(wanted: Mapping[str, bool]) -> Measured:
        gone = {"r0": "tensor 'r0' was not observed (read once)"}
        return Measured({t: stats_of(t, 1.0) for t in wanted if t not in gone}, gone)

    placement = place(facts, PROFILES["tensorrt"], cfg.placement, measure)
    conv1 = next(d for d in placement.annotations.decisions if d.node == "conv1")
    assert not conv1.quantized and conv1.reason == "tensor 'r0' was not observed (read once)"
    assert "r0" not in placement.annotations.tensors and placement.rounds == 2


def test_a_measure_that_drops_a_tensor_without_a_reason_is_a_bug_not_a_silent_gap():
    facts, cfg = setup()

    def measure(wanted: Mapping[str, bool]) -> Measured:
        return Measured({t: stats_of(t, 1.0) for t in wanted if t != "r2"})

    with pytest.raises(InternalError, match="no statistics and no reason for 1 tensor"):
        place(facts, PROFILES["tensorrt"], cfg.placement, measure)


def test_the_measure_is_told_which_tensors_need_a_histogram():
    facts, _ = setup()
    seen: list[dict[str, bool]] = []

    def measure(wanted: Mapping[str, bool]) -> Measured:
        seen.append(dict(wanted))
        return Measured({t: stats_of(t, 1.0) for t in wanted})

    place(facts, PROFILES["tensorrt"], QuantConfig(method="minmax").placement, measure)
    assert seen == [dict.fromkeys(["x", "r0", "r1", "r2"], False)]
    seen.clear()
    place(facts, PROFILES["tensorrt"], QuantConfig(method="mse").placement, measure)
    assert seen == [dict.fromkeys(["x", "r0", "r1", "r2"], True)]


def test_every_op_of_a_body_that_never_ran_stays_float_with_the_reason():
    from tests import control_flow_graphs as cf

    facts = GraphFacts.of(ir.Graph(ir.infer_shapes(cf.if_convs())), PROFILES["tensorrt"])
    calls: list[list[str]] = []

    def measure(wanted: Mapping[str, bool]) -> Measured:
        calls.append(list(wanted))
        runs = {"if/then_branch": 4, "if/else_branch": 0}
        return Measured({t: stats_of(t, 1.0) for t in wanted}, body_runs=runs)

    placement = place(facts, PROFILES["tensorrt"], QuantConfig().placement, measure)
    decisions = {d.node: d for d in placement.annotations.decisions}
    why = "branch never taken on the calibration data (else_branch of If 'if')"
    assert [decisions[n].reason for n in ("else_conv", "else_mul", "else.half_const")] == [why] * 3
    assert decisions["then_conv"].quantized
    assert placement.rounds == 2 and calls[0] == ["x"] and calls[1] == ["x"]
