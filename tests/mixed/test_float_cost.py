"""The search that keeps the fewest multiply-adds float (``target_cost: macs``): its order, the
lazy greedy, the fall-back when no single layer helps, the pruning, and a run end to end."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import pytest

import onnxq
from onnxq import ir
from onnxq.cli import main
from onnxq.errors import ConfigError
from onnxq.mixed.float_cost import by_gain_per_mac, choose_by_macs, layer_neighbours
from onnxq.mixed.search import choose, reason
from onnxq.mixed.sensitivity import LayerSensitivity
from onnxq.numerics.accuracy_target import AccuracyTarget
from tests import graphs
from tests.mixed.test_search import conv_chain


def layer(node: str, gain: float, macs: int) -> LayerSensitivity:
    return LayerSensitivity(node, "Conv", gain, gain, macs, 0)


class ScoredBy:
    """Trials whose score of a float set is ``fn(set)``; counts the distinct sets scored."""

    def __init__(
        self,
        threshold: float,
        fn: Callable[[frozenset[str]], float],
        placed: Callable[[frozenset[str]], int] | None = None,
    ) -> None:
        self.target = AccuracyTarget("cosine", threshold)
        self.fn, self.placed = fn, placed
        self.scored: set[frozenset[str]] = set()
        self.facts: Any = None

    def float_macs(self, nodes: Iterable[str]) -> int | None:
        """What the placement leaves float; None: unknown (the layers' own then count)."""
        return None if self.placed is None else self.placed(frozenset(nodes))

    def score(self, nodes: Iterable[str]) -> float:
        key = frozenset(nodes)
        self.scored.add(key)
        return self.fn(key)


GAINS = {"big": 0.5, "small1": 0.3, "small2": 0.3, "tiny": 0.01}
MACS = {"big": 1000, "small1": 10, "small2": 10, "tiny": 10}
RANKING = [layer(n, GAINS[n], MACS[n]) for n in ("big", "small1", "small2", "tiny")]


def additive(nodes: frozenset[str]) -> float:
    return sum(GAINS[n] for n in nodes)


def test_order_is_gain_per_mac_and_non_gaining_layers_last():
    ranking = [layer("a", 0.5, 1000), layer("b", 0.0, 1), layer("c", 0.1, 10), layer("d", 0.2, 10)]
    assert [s.node for s in by_gain_per_mac(ranking)] == ["d", "c", "a", "b"]


def test_macs_keeps_two_cheap_layers_where_layers_keeps_the_big_one():
    by_layers = choose(ScoredBy(0.55, additive), 0.0, RANKING, "layers")
    by_macs = choose_by_macs(ScoredBy(0.55, additive), 0.0, RANKING)  # type: ignore[arg-type]
    assert [s.node for s in by_layers] == ["big", "small1"]  # 1010 multiply-adds
    assert sorted(s.node for s in by_macs) == ["small1", "small2"]  # 20


def test_macs_takes_the_gain_ranking_when_that_is_cheaper():
    # the greedy takes m1 then m2 (120 multiply-adds); `big` alone meets it with 100
    gains = {"big": 0.5, "m1": 0.35, "m2": 0.35}
    macs = {"big": 100, "m1": 60, "m2": 60}
    ranking = [layer(n, gains[n], macs[n]) for n in gains]
    trials = ScoredBy(0.5, lambda nodes: sum(gains[n] for n in nodes))
    greedy = choose_by_macs(trials, 0.0, ranking)  # type: ignore[arg-type]
    assert sorted(s.node for s in greedy) == ["m1", "m2"]
    trials.facts = SimpleNamespace(graph=ir.Graph(conv_chain()))  # no node of the ranking
    assert [s.node for s in choose(trials, 0.0, ranking, "macs")] == ["big"]  # type: ignore[arg-type]


def test_cost_is_what_the_placement_leaves_float():
    # `a` is cheap alone, but its placement takes 100 more multiply-adds out of INT8 with it
    ranking = [layer("a", 0.3, 10), layer("b", 0.3, 20)]
    own = {"a": 10, "b": 20}

    def placed(nodes: frozenset[str]) -> int:
        return sum(own[n] for n in nodes) + (100 if "a" in nodes else 0)

    naive = choose_by_macs(ScoredBy(0.3, additive_of(ranking)), 0.0, ranking)  # type: ignore[arg-type]
    assert [s.node for s in naive] == ["a"]
    trials = ScoredBy(0.3, additive_of(ranking), placed)
    assert [s.node for s in choose_by_macs(trials, 0.0, ranking)] == ["b"]  # type: ignore[arg-type]


def additive_of(ranking: list[LayerSensitivity]) -> Callable[[frozenset[str]], float]:
    gains = {s.node: s.gain for s in ranking}
    return lambda nodes: sum(gains[n] for n in nodes)


def test_lazy_greedy_scores_few_sets_when_gains_add_up():
    gains = {f"l{i}": 0.01 * (i + 1) for i in range(20)}
    ranking = [layer(n, g, 10) for n, g in gains.items()]
    trials = ScoredBy(0.5, lambda nodes: sum(gains[n] for n in nodes))
    kept = choose_by_macs(trials, 0.0, ranking)  # type: ignore[arg-type]
    assert sum(gains[s.node] for s in kept) >= 0.5
    assert [s.node for s in kept] == ["l19", "l18", "l17", "l16"][: len(kept)]
    # a full greedy scores every candidate at every step (about 20 x 4 sets)
    assert len(trials.scored) <= 2 * 20


def test_no_layer_helps_given_the_others_falls_back_to_bisection_then_prunes():
    # only `big` reaches the target; the small ones each help alone but not together
    def score(nodes: frozenset[str]) -> float:
        return 1.0 if "big" in nodes else (0.3 if nodes else 0.0)

    trials = ScoredBy(0.9, score)
    kept = choose_by_macs(trials, 0.0, RANKING)  # type: ignore[arg-type]
    assert [s.node for s in kept] == ["big"]


def test_pruning_drops_the_most_multiply_adds_first():
    # any two of the three meet the target: the two cheapest stay
    gains = {"x": 0.3, "y": 0.3, "z": 0.3}
    macs = {"x": 50, "y": 40, "z": 30}
    ranking = [layer(n, gains[n], macs[n]) for n in ("x", "y", "z")]

    def score(nodes: frozenset[str]) -> float:
        return 0.3 * len(nodes) + (0.2 if len(nodes) == 1 and "x" in nodes else 0.0)

    kept = choose_by_macs(ScoredBy(0.6, score), 0.0, ranking)  # type: ignore[arg-type]
    assert sorted(s.node for s in kept) == ["y", "z"]


def test_a_layer_taken_has_its_neighbours_scored_again():
    # dw gains little alone and much once pw (which reads its output) is float too
    gains = {"pw": 0.3, "x": 0.2, "y": 0.2, "dw": 0.001}
    macs = {"pw": 100, "x": 100, "y": 100, "dw": 1}
    ranking = [layer(n, gains[n], macs[n]) for n in gains]

    def score(nodes: frozenset[str]) -> float:
        return sum(gains[n] for n in nodes) + (0.3 if {"dw", "pw"} <= nodes else 0.0)

    alone = choose_by_macs(ScoredBy(0.6, score), 0.0, ranking)  # type: ignore[arg-type]
    assert sorted(s.node for s in alone) == ["pw", "x", "y"]  # 300 multiply-adds
    near = {"pw": {"dw"}, "dw": {"pw"}}
    kept = choose_by_macs(ScoredBy(0.6, score), 0.0, ranking, near)  # type: ignore[arg-type]
    assert sorted(s.node for s in kept) == ["dw", "pw"]  # 101


def test_neighbours_are_the_layers_reached_through_non_layer_ops():
    graph = ir.Graph(conv_chain(layers=4))  # conv -> relu -> conv -> ...
    near = layer_neighbours(graph, ["conv0", "conv1", "conv3"])
    assert near == {"conv0": {"conv1"}, "conv1": {"conv0"}, "conv3": set()}  # conv2 in between
    assert layer_neighbours(graph, [f"conv{i}" for i in range(4)])["conv2"] == {"conv1", "conv3"}


def test_run_with_target_cost_macs_reports_cost_and_shares():
    m = conv_chain()
    base = onnxq.quantize(
        m, graphs.random_batches(m, 16), progress=False, target="cosine=0.0"
    ).report.mixed_precision
    top = base["sensitivity"][0]
    threshold = (top["score_float_alone"] + base["int8_score"]) / 2
    result = onnxq.quantize(
        m,
        graphs.random_batches(m, 16),
        progress=False,
        target=f"cosine={threshold}",
        target_cost="macs",
    )
    record = result.report.mixed_precision
    assert record["cost"] == "macs" and record["met"]
    assert record["kept_float"], "the target lies above the all-INT8 score"
    for kept in record["kept_float"]:
        assert kept["macs_share"] == pytest.approx(kept["macs"] / record["model_macs"], abs=1e-6)
    assert "of the model)" in result.report.summary(timing=False)


def test_unknown_target_cost_is_a_config_error():
    m = conv_chain()
    with pytest.raises(ConfigError, match="target_cost"):
        onnxq.quantize(m, graphs.random_batches(m, 16), target="cosine=0.9", target_cost="flops")


def test_cli_target_cost_macs(tmp_path, model_file, calib_dir):
    path, calib = model_file(conv_chain()), calib_dir(conv_chain(), n=8)
    out, report = tmp_path / "q.onnx", tmp_path / "r.json"
    code = main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q", "--target",
                 "cosine=0.9", "--target-cost", "macs", "--report", str(report)])  # fmt: skip
    assert code == 0
    assert json.loads(report.read_text())["mixed_precision"]["cost"] == "macs"


def test_reason_of_a_layer_that_gains_nothing_alone():
    target = AccuracyTarget("cosine", 0.99)
    assert "raises cosine by 0.01" in reason(layer("a", 0.01, 10), target)
    why = reason(layer("b", -0.0001, 10), target)
    assert "changes cosine by -0.0001" in why and "does not hold without it" in why
