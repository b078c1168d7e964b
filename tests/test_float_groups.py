"""Layers of one kind as starts of the ``--target-max-float-macs`` search: the kinds, the groups,
and a search whose layers gain only together."""

from __future__ import annotations

from onnx import helper

from onnxq import ir
from onnxq.float_budget import choose_within
from onnxq.float_cost import greedy
from onnxq.float_groups import MIN_GROUP, kind_groups, layer_kind
from tests import graphs
from tests.test_float_cost import ScoredBy, layer
from tests.test_mixed_precision import conv_chain


def mixed_layers() -> ir.Graph:
    """x[1,8,6,6] -> spatial 3x3 -> depthwise 3x3 -> pointwise 1x1 -> grouped 3x3 (2 groups)
    -> Flatten -> Gemm."""
    r = graphs.rng(0)
    convs = [
        ("spatial", [8, 8, 3, 3], 1),
        ("depthwise", [8, 1, 3, 3], 8),
        ("pointwise", [8, 8, 1, 1], 1),
        ("grouped", [8, 4, 3, 3], 2),
    ]
    nodes, inits, src = [], [], "x"
    for name, shape, group in convs:
        pads = [1, 1, 1, 1] if shape[2] == 3 else [0, 0, 0, 0]
        nodes.append(
            helper.make_node("Conv", [src, f"w_{name}"], [name], name=name, group=group, pads=pads)
        )
        inits.append(graphs.init(f"w_{name}", graphs.weight(r, *shape)))
        src = name
    nodes += [
        helper.make_node("Flatten", [src], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w_gemm"], ["y"], name="gemm", transB=1),
    ]
    inits.append(graphs.init("w_gemm", graphs.weight(r, 4, 8 * 6 * 6)))
    m = graphs.model(nodes, [graphs.tensor("x", [1, 8, 6, 6])], [graphs.tensor("y", [1, 4])], inits)
    return ir.Graph(m)


def test_each_layer_has_its_structural_kind():
    graph = mixed_layers()
    kinds = {name: layer_kind(graph, name) for name in ("spatial", "depthwise", "pointwise")}
    assert kinds == {"spatial": "spatial", "depthwise": "depthwise", "pointwise": "pointwise"}
    assert layer_kind(graph, "grouped") == "grouped"
    assert layer_kind(graph, "gemm") == "Gemm"
    assert layer_kind(graph, "no such node") is None


def test_groups_are_kinds_with_enough_layers_in_ranking_order():
    graph = mixed_layers()
    ranking = [layer("pointwise", 0.1, 1), layer("depthwise", 0.2, 1), layer("gemm", 0.3, 1)]
    assert kind_groups(graph, ranking) == []  # one layer of each kind
    chain = ir.Graph(conv_chain(layers=4))
    ranking = [layer(f"conv{i}", 0.1 * i, 1) for i in (3, 0, 2, 1)]
    (group,) = kind_groups(chain, ranking)
    assert [s.node for s in group] == ["conv3", "conv0", "conv2", "conv1"]
    assert len(group) >= MIN_GROUP and layer_kind(chain, "conv0") == "spatial"


SPREAD_MACS = {"big": 30, "a": 10, "b": 10, "c": 10}


class Spread:
    """Three cheap layers of one kind that gain only all together (0.6), and a big one whose
    gain per multiply-add heads the greedy's order."""

    @staticmethod
    def score(nodes: frozenset[str]) -> float:
        together = 0.6 if {"a", "b", "c"} <= nodes else 0.01 * len(nodes & {"a", "b", "c"})
        return together + (0.3 if "big" in nodes else 0.0)

    @staticmethod
    def placed(nodes: frozenset[str]) -> int:
        return sum(SPREAD_MACS[n] for n in nodes)


RANKING = [layer("big", 0.3, 30), layer("a", 0.01, 10), layer("b", 0.01, 10), layer("c", 0.01, 10)]


def test_the_group_start_finds_what_the_greedy_misses_within_the_ceiling():
    group = [s for s in RANKING if s.node != "big"]
    alone = choose_within(ScoredBy(0.9, Spread.score, Spread.placed), 0.0, RANKING, 40)  # type: ignore[arg-type]
    assert sorted(s.node for s in alone) == ["a", "big"]  # the greedy: 0.31
    trials = ScoredBy(0.9, Spread.score, Spread.placed)
    kept = choose_within(trials, 0.0, RANKING, 40, None, [group])  # type: ignore[arg-type]
    assert sorted(s.node for s in kept) == ["a", "b", "c"]  # 0.6, within 40
    assert all(Spread.placed(key) <= 40 for key in trials.scored)


def test_a_group_over_the_ceiling_or_a_met_target_adds_no_trials():
    group = [s for s in RANKING if s.node != "big"]
    trials = ScoredBy(0.9, Spread.score, Spread.placed)
    choose_within(trials, 0.0, RANKING, 25, None, [group])  # type: ignore[arg-type]
    assert frozenset({"a", "b", "c"}) not in trials.scored
    met = ScoredBy(0.3, Spread.score, Spread.placed)
    assert [s.node for s in choose_within(met, 0.0, RANKING, 40, None, [group])] == ["big"]  # type: ignore[arg-type]
    assert frozenset({"a", "b", "c"}) not in met.scored


def test_greedy_from_a_start_adds_to_it():
    trials = ScoredBy(0.95, Spread.score, Spread.placed)
    start = RANKING[1:]

    def score(layers) -> float:
        return trials.score(s.node for s in layers)

    def cost(layers) -> int:
        return Spread.placed(frozenset(s.node for s in layers))

    kept = greedy(score, cost, trials.target.met, score(start), RANKING, {}, None, start)
    assert [s.node for s in kept] == ["a", "b", "c", "big"]
