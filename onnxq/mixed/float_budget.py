"""A ceiling on what the ``--target`` search leaves out of INT8: at most a share of the model's
multiply-adds float (``target_max_float_macs``, ``--target-max-float-macs 10%``).

The search (:func:`onnxq.mixed.search.choose`) first chooses as it does without a ceiling;
only when that choice leaves more multiply-adds float than the ceiling does
:func:`choose_within` choose again:

1. the lazy greedy of :mod:`onnxq.mixed.float_cost` by gain per multiply-add, where a layer that
   would take the settled placement's float multiply-adds over the ceiling is dropped without
   a trial (checking costs a placement, no onnxruntime run); the greedy starts as the
   unconstrained one did, so its first trials are already scored;
2. of the models scored within the ceiling (the all-INT8 one, each layer alone float, the
   greedy's sets), those that meet the target: the one with the fewest float multiply-adds,
   pruned (a layer goes back to INT8 when the target holds without it);
3. none meets it: the one with the best score is kept, and the result says the target was
   missed within the ceiling (:func:`ceiling_warning`).

The ceiling counts the whole model, as the report's ``model_float_macs_fraction`` does: layers
the placement leaves float for any reason count too.  When the all-INT8 placement already
leaves more than the ceiling float, no layer is kept float and the result says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from onnxq.mixed.float_cost import by_gain_per_mac, greedy, layer_neighbours, placement_cost, prune

if TYPE_CHECKING:
    from onnxq.mixed.sensitivity import LayerSensitivity, Trials


def ceiling(share: float | None, model_macs: int | None) -> int | None:
    """The float multiply-adds per sample that ``share`` of ``model_macs`` allows; None: no
    ceiling (none asked for, or the model's multiply-adds are unknown)."""
    if share is None or model_macs is None:
        return None
    return math.floor(share * model_macs)


def within_ceiling(
    trials: Trials,
    base: float,
    ranking: Sequence[LayerSensitivity],
    chosen: list[LayerSensitivity],
    limit: int | None,
) -> list[LayerSensitivity]:
    """``chosen`` (the search's choice without a ceiling) when it fits ``limit`` (float
    multiply-adds per sample; None: any), else :func:`choose_within`'s choice."""
    if limit is None or placement_cost(trials)(chosen) <= limit:
        return chosen
    near = layer_neighbours(trials.facts.graph, (s.node for s in ranking))
    return choose_within(trials, base, ranking, limit, near)


def choose_within(
    trials: Trials,
    base: float,
    ranking: Sequence[LayerSensitivity],
    limit: int,
    neighbours: dict[str, set[str]] | None = None,
) -> list[LayerSensitivity]:
    """The layers to keep float that leave at most ``limit`` multiply-adds per sample out of
    INT8 (see the module); ``base``: the all-INT8 score; ``neighbours``:
    :func:`onnxq.mixed.float_cost.layer_neighbours` of the candidates (None: none)."""
    target = trials.target
    cost = placement_cost(trials)
    scored: dict[frozenset[str], tuple[float, list[LayerSensitivity]]] = {frozenset(): (base, [])}

    def score(layers: Sequence[LayerSensitivity]) -> float:
        value = trials.score(s.node for s in layers)
        scored[frozenset(s.node for s in layers)] = (value, list(layers))
        return value

    def fits(layers: Sequence[LayerSensitivity]) -> bool:
        return cost(layers) <= limit

    if not fits([]):
        return []
    for layer in ranking:  # alone: scored by the ranking already
        if fits([layer]):
            scored[frozenset([layer.node])] = (layer.alone, [layer])
    greedy(score, cost, target.met, base, by_gain_per_mac(ranking), neighbours or {}, fits)
    return _best(list(scored.values()), score, cost, target.met)


def _best(
    scored: list[tuple[float, list[LayerSensitivity]]],
    score: Callable[[Sequence[LayerSensitivity]], float],
    cost: Callable[[Sequence[LayerSensitivity]], int],
    met: Callable[[float], bool],
) -> list[LayerSensitivity]:
    """Of ``scored`` (score, layers) sets that fit: the cheapest that meets the target, pruned;
    else the best scoring (ties: fewer multiply-adds, fewer layers, names)."""

    def names(layers: list[LayerSensitivity]) -> list[str]:
        return sorted(s.node for s in layers)

    meeting = [layers for value, layers in scored if met(value)]
    if meeting:
        cheapest = min(meeting, key=lambda layers: (cost(layers), len(layers), names(layers)))
        return prune(cheapest, score, cost, met)
    _, layers = min(
        scored,
        key=lambda item: (-item[0], cost(item[1]), len(item[1]), names(item[1])),
    )
    return layers


def ceiling_warning(share: float, every: int | None, left_float: int | None) -> str | None:
    """Why the ceiling ``share`` was not (or could not be) applied, given the model's
    multiply-adds and what the all-INT8 placement leaves float (None: unknown); None: it was."""
    if every is None or left_float is None:
        return (
            f"target_max_float_macs {share:.1%} ignored: the model's multiply-adds are unknown "
            "(a Conv/Gemm/MatMul shape is not static)"
        )
    if left_float > share * every:
        return (
            f"target_max_float_macs {share:.1%}: the all-INT8 placement already leaves "
            f"{left_float / every:.1%} of the model's multiply-adds float (layers the backend "
            "does not quantize); no layer was kept float for the target"
        )
    return None


__all__ = ["ceiling", "ceiling_warning", "choose_within", "within_ceiling"]
