"""The ``--target`` search's choice confirmed as the run writes it, and topped up when it
falls short there.

The trials score every placement with one set of statistics; where the run writes the chosen
placement with statistics of its own (quantized-prefix ranges measured with that placement's
prefix quantized: :func:`onnxq.recover.confirm.written_statistics`), a choice that met the
target in the trials can miss it as written (mobilenet_v2, ``cosine=0.998``: 0.99805 in the
trials, 0.99777 as written).  :func:`confirm` scores the choice with its written statistics
(one more calibration pass over the data per confirmation, plus a trial); when that misses the
target, layers are added one at a time, by gain per multiply-add and within the ceiling
(:mod:`onnxq.mixed.float_budget`), each confirmed the same way, until the target holds or
:data:`MAX_TOP_UPS` were tried; the best confirmed set is kept.  The other recovery steps
(AdaRound, sequential correction) are not run in confirmations (each costs minutes on a
mobilenet); the run's verdict is measured on the model written, with them
(:meth:`onnxq.mixed.record.MixedPrecision.as_written`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from onnxq.mixed.float_cost import by_gain_per_mac, placement_cost

if TYPE_CHECKING:
    from onnxq.mixed.sensitivity import LayerSensitivity, Trials
    from onnxq.place.loop import Placement
    from onnxq.recover.confirm import Measure

# the most layers added to a choice that misses the target as written
MAX_TOP_UPS = 8

CONFIRM_REASON = "kept float for the confirmation of the accuracy target"


def confirm(
    trials: Trials,
    kept: list[LayerSensitivity],
    ranking: Sequence[LayerSensitivity],
    limit: int | None,
    remeasure: Callable[[Placement[Any]], Measure],
) -> tuple[list[LayerSensitivity], int]:
    """``kept`` (which met the target in the trials), or the set the top-up found (see the
    module), and the number of confirmations run; ``limit``: the ceiling on float
    multiply-adds (None: none)."""
    cost = placement_cost(trials)

    def written(layers: Sequence[LayerSensitivity]) -> float:
        nodes = dict.fromkeys(sorted(s.node for s in layers), CONFIRM_REASON)
        fresh = dataclasses.replace(
            trials, measure=remeasure(trials.placement(nodes)), count=0, scores={}, macs={},
            qparams={},
        )  # fmt: skip
        return fresh.score(nodes)

    return top_up(written, trials.target.met, cost, kept, ranking, limit)


def top_up(
    written: Callable[[Sequence[LayerSensitivity]], float],
    met: Callable[[float], bool],
    cost: Callable[[Sequence[LayerSensitivity]], int],
    kept: list[LayerSensitivity],
    ranking: Sequence[LayerSensitivity],
    limit: int | None,
) -> tuple[list[LayerSensitivity], int]:
    """``kept`` scored by ``written``; while the best set so far misses (``met``), ``kept``
    plus the next layers by gain per multiply-add that fit ``limit`` (by ``cost``), one more
    each time, at most :data:`MAX_TOP_UPS`: the best set scored (the first to meet the
    target), and the number of sets scored."""
    best_score, best = written(kept), kept
    runs = 1
    layers = list(kept)
    for layer in by_gain_per_mac(ranking):
        if met(best_score) or runs > MAX_TOP_UPS:
            break
        if layer in layers or (limit is not None and cost([*layers, layer]) > limit):
            continue
        layers = [*layers, layer]
        score = written(layers)
        runs += 1
        if score > best_score:
            best_score, best = score, layers
    return best, runs


__all__ = ["MAX_TOP_UPS", "confirm", "top_up"]
