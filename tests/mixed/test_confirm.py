"""The ``--target`` search's choice confirmed with the statistics the run writes it with
(quantized-prefix ranges of the chosen placement), and topped up when it misses there."""

from __future__ import annotations

from collections.abc import Sequence

import onnxq
from onnxq.mixed.confirm import MAX_TOP_UPS, top_up
from onnxq.mixed.sensitivity import LayerSensitivity
from tests import graphs
from tests.mixed.test_float_cost import layer
from tests.mixed.test_search import conv_chain

RANKING = [layer("a", 0.3, 10), layer("b", 0.2, 10), layer("c", 0.1, 10), layer("d", 0.05, 100)]


def names(layers: Sequence[LayerSensitivity]) -> list[str]:
    return sorted(s.node for s in layers)


def cost(layers: Sequence[LayerSensitivity]) -> int:
    return sum(s.macs or 0 for s in layers)


def written_as(gains: dict[str, float], seen: list[list[str]]):
    def written(layers: Sequence[LayerSensitivity]) -> float:
        seen.append(names(layers))
        return sum(gains[s.node] for s in layers)

    return written


def test_a_choice_that_holds_as_written_is_kept_after_one_run():
    seen: list[list[str]] = []
    kept, runs = top_up(
        written_as({"a": 0.5}, seen), lambda v: v >= 0.4, cost, [RANKING[0]], RANKING, None
    )
    assert names(kept) == ["a"] and runs == 1 and seen == [["a"]]


def test_a_choice_that_misses_as_written_gets_the_next_layers_by_gain_per_mac():
    seen: list[list[str]] = []
    gains = {"a": 0.3, "b": 0.05, "c": 0.1, "d": 0.0}
    kept, runs = top_up(
        written_as(gains, seen), lambda v: v >= 0.42, cost, [RANKING[0]], RANKING, None
    )
    assert seen == [["a"], ["a", "b"], ["a", "b", "c"]]
    assert names(kept) == ["a", "b", "c"] and runs == 3


def test_top_up_stays_within_the_ceiling_and_keeps_the_best_when_it_misses():
    seen: list[list[str]] = []
    gains = {"a": 0.3, "b": 0.05, "c": -0.2, "d": 0.5}
    kept, runs = top_up(
        written_as(gains, seen), lambda v: v >= 0.9, cost, [RANKING[0]], RANKING, 30
    )
    assert all(cost_of(s) <= 30 for s in seen)  # d (100) never fits
    assert names(kept) == ["a", "b"] and runs == 3  # a + b + c scores less


def cost_of(nodes: list[str]) -> int:
    return sum({"a": 10, "b": 10, "c": 10, "d": 100}[n] for n in nodes)


def test_top_up_is_bounded():
    many = [layer(f"l{i}", 0.01, 1) for i in range(3 * MAX_TOP_UPS)]
    kept, runs = top_up(lambda layers: 0.0, lambda v: v >= 1.0, cost, [], many, None)
    assert runs == MAX_TOP_UPS + 1 and kept == []


def test_prefix_run_confirms_its_choice_and_its_verdict_is_the_written_models():
    m = conv_chain()
    calib = graphs.random_batches(m, 16)
    base = onnxq.quantize(m, calib, progress=False, target="cosine=0.0", calibration_mode="prefix")
    record = base.report.mixed_precision
    top = record["sensitivity"][0]
    threshold = (top["score_float_alone"] + record["int8_score"]) / 2
    result = onnxq.quantize(
        m, calib, progress=False, target=f"cosine={threshold}", calibration_mode="prefix"
    )
    record = result.report.mixed_precision
    assert record["kept_float"] and record["confirmations"] >= 1
    assert record["met"] and record["score"] >= threshold  # the model written meets it
    plain = onnxq.quantize(m, calib, progress=False, target=f"cosine={threshold}")
    assert plain.report.mixed_precision["confirmations"] == 0  # float ranges: nothing to confirm
