"""What the ``--target`` search minimises: the number of float layers, or the multiply-adds they
leave out of INT8 (``target_cost``, ``--target-cost``).

``layers`` (:func:`onnxq.mixed.search.choose`) ranks the layers by gain (how much the metric
rises when one alone stays float), keeps the shortest prefix of that ranking that meets the
target and prunes it: few layers, but the most sensitive layers of a network whose error is
spread are often its largest ones.

``macs`` (:func:`choose_by_macs`) buys accuracy where it is cheapest: a greedy search that adds,
one at a time, the layer with the largest gain per multiply-add *given the layers already
float*, until the target holds.  A layer's multiply-adds are what the settled placement leaves
float with it (:func:`placement_cost`): keeping one layer float can take a neighbour's INT8
kernel with it.  Re-scoring every candidate at every step would cost L trials
per step; instead each candidate's last measured gain per multiply-add is kept in a heap (at
first its gain alone), and only the top one is scored again on the current set: when its fresh
figure still heads the heap it is taken (lazy greedy).  Gains mostly shrink as the error left
shrinks, so a stale figure is mostly an upper bound and a step costs a few trials.  Not between
neighbours: a depthwise conv float gains little while the conv reading its output still
quantizes that output, and much once that conv is float too.  So when a layer is taken, the
layers it reaches through non-layer ops (Relu, Clip, Add, ...) and those that reach it are
scored again next (those that gained nothing alone too).  When no candidate
raises the metric any more, the rest are appended in gain-per-MAC order and the shortest prefix
that meets the target is found by bisection.  Last, the kept layers are pruned, those whose
removal saves most multiply-adds first: a layer goes back to INT8 when the target holds
without it.  :func:`onnxq.mixed.search.choose` then keeps this choice or the ``layers``
one, whichever leaves fewer multiply-adds float.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from onnxq.config.options import TARGET_COSTS
from onnxq.ir.ops import WEIGHTED_OPS  # the ops whose multiply-adds count

if TYPE_CHECKING:  # onnxq.config reads COSTS; onnxq.mixed.sensitivity reads onnxq.config
    from onnxq import ir
    from onnxq.mixed.sensitivity import LayerSensitivity, Trials

COSTS = TARGET_COSTS  # the values of ``target_cost``


def macs_known(ranking: Sequence[LayerSensitivity]) -> bool:
    """True if every candidate's multiply-adds are known (static shapes)."""
    return all(s.macs is not None for s in ranking)


def _cost(layer: LayerSensitivity) -> int:
    return max(layer.macs or 0, 1)


def by_gain_per_mac(ranking: Sequence[LayerSensitivity]) -> list[LayerSensitivity]:
    """``ranking`` in the order of gain per multiply-add, largest first; layers that gain
    nothing alone last, in ``ranking``'s order."""
    gaining = [s for s in ranking if s.gain > 0]
    rest = [s for s in ranking if not s.gain > 0]
    return sorted(gaining, key=lambda s: -s.gain / _cost(s)) + rest


def layer_neighbours(graph: ir.Graph, layers: Iterable[str]) -> dict[str, set[str]]:
    """For each of ``layers`` (node names), the others its output reaches, or that reach its
    input, through ops that are not Conv/ConvTranspose/Gemm/MatMul."""
    names = set(layers)
    found: dict[str, set[str]] = {name: set() for name in names}
    for name in sorted(names):
        node = graph.node_by_name(name)
        todo = [t for t in node.output if t] if node is not None else []
        seen: set[str] = set()
        while todo:
            tensor = todo.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            for consumer, _ in graph.consumers.get(tensor, []):
                if consumer.name in names and consumer.name != name:
                    found[name].add(consumer.name)
                    found[consumer.name].add(name)
                elif consumer.op_type not in WEIGHTED_OPS:  # a path crossing a layer: no neighbours
                    todo.extend(t for t in consumer.output if t)
    return found


def choose_by_macs(
    trials: Trials,
    base: float,
    ranking: Sequence[LayerSensitivity],
    neighbours: Mapping[str, set[str]] | None = None,
) -> list[LayerSensitivity]:
    """The layers to keep float, fewest multiply-adds first (see the module); ``base``: the
    all-INT8 score, and every candidate float must meet the target (the caller checks);
    ``neighbours``: :func:`layer_neighbours` of the candidates (None: none)."""
    target = trials.target

    def score(layers: Sequence[LayerSensitivity]) -> float:
        return trials.score(s.node for s in layers)

    cost = placement_cost(trials)
    kept = greedy(score, cost, target.met, base, by_gain_per_mac(ranking), neighbours or {})
    if not target.met(score(kept)):
        rest = [s for s in by_gain_per_mac(ranking) if s not in kept]
        kept = kept + rest[: _shortest_prefix(lambda n: target.met(score(kept + rest[:n])), rest)]
    return prune(kept, score, cost, target.met)


def prune(
    kept: list[LayerSensitivity],
    score: Callable[[Sequence[LayerSensitivity]], float],
    cost: Callable[[Sequence[LayerSensitivity]], int],
    met: Callable[[float], bool],
) -> list[LayerSensitivity]:
    """``kept`` (which meets the target) without the layers the target holds without, those
    whose removal saves most multiply-adds tried first (a layer's saving measured once, on
    ``kept`` as given)."""
    saving = {s.node: cost(kept) - cost([k for k in kept if k is not s]) for s in kept}
    for layer in sorted(kept, key=lambda s: (-saving[s.node], s.gain)):
        without = [s for s in kept if s is not layer]
        if without and met(score(without)):
            kept = without
    return kept


def placement_cost(trials: Trials) -> Callable[[Sequence[LayerSensitivity]], int]:
    """The multiply-adds a set of float layers leaves out of INT8: the settled placement's
    (:meth:`onnxq.mixed.sensitivity.Trials.float_macs`), else the sum of the layers' own."""

    def cost(layers: Sequence[LayerSensitivity]) -> int:
        placed = trials.float_macs(s.node for s in layers)
        return placed if placed is not None else sum(_cost(s) for s in layers)

    return cost


def greedy(
    score: Callable[[Sequence[LayerSensitivity]], float],
    cost: Callable[[Sequence[LayerSensitivity]], int],
    met: Callable[[float], bool],
    base: float,
    order: list[LayerSensitivity],
    neighbours: Mapping[str, set[str]],
    fits: Callable[[Sequence[LayerSensitivity]], bool] | None = None,
) -> list[LayerSensitivity]:
    """Lazy greedy by gain per multiply-add until ``met``, or until nothing raises the score;
    a layer's fresh figure divides by what it adds to ``cost``; a layer taken has its
    ``neighbours`` scored next; with ``fits``, a layer that would make the set not fit is
    dropped unscored."""
    kept: list[LayerSensitivity] = []
    current = base
    first = {s.node: -s.gain / _cost(s) for s in order}
    position = {s.node: i for i, s in enumerate(order)}
    by_node = {s.node: s for s in order}
    # (-gain per MAC, position, the len(kept) it was measured at, layer); `latest`: the one
    # entry of each layer that counts (a neighbour's refresh leaves an old one behind)
    heap = [(first[s.node], position[s.node], -1, s) for s in order if s.gain > 0]
    latest = {entry[3].node: entry for entry in heap}
    heapq.heapify(heap)

    def push(entry: tuple[float, int, int, LayerSensitivity]) -> None:
        latest[entry[3].node] = entry
        heapq.heappush(heap, entry)

    while heap and not met(current):
        entry = heapq.heappop(heap)
        ratio, i, measured_at, layer = entry
        if latest.get(layer.node) is not entry:
            continue
        if measured_at == len(kept):  # fresh, and still the best
            if ratio >= 0 or not math.isfinite(ratio):
                break  # no candidate raises the score
            kept.append(layer)
            latest.pop(layer.node)
            current = score(kept)
            taken = {s.node for s in kept}
            for near in sorted(neighbours.get(layer.node, ()), key=lambda n: position.get(n, -1)):
                if near in position and near not in taken:  # scored next: as good as `layer`
                    push((min(first[near], ratio), position[near], -1, by_node[near]))
            continue
        if fits is not None and not fits([*kept, layer]):
            latest.pop(layer.node)
            continue
        fresh = score([*kept, layer])
        added = max(cost([*kept, layer]) - cost(kept), 1)
        push((-(fresh - current) / added, i, len(kept), layer))
    return kept


def _shortest_prefix(meets: Callable[[int], bool], items: Sequence[object]) -> int:
    """The smallest n with ``meets(n)``, by bisection; ``meets(len(items))`` must hold."""
    low, high = -1, len(items)
    while high - low > 1:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


__all__ = [
    "COSTS",
    "by_gain_per_mac",
    "choose_by_macs",
    "greedy",
    "layer_neighbours",
    "macs_known",
    "placement_cost",
    "prune",
]
