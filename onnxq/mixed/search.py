"""Automatic mixed precision: keep the fewest, most harmful layers float until an accuracy
target holds on held-out batches (``onnxq quantize ... --target cosine=0.999``).

After the placement loop has calibrated once, :func:`find_mixed_precision` ranks the quantized
Conv/ConvTranspose/Gemm/MatMul layers by how much the target metric gains when each alone
stays float (:func:`onnxq.mixed.sensitivity.rank_layers`: L + 1 trials, no recalibration), then:

1. the all-INT8 model meets the target: nothing is kept float;
2. else the shortest prefix of the ranking that meets the target is found by bisection
   (about log2 L trials); if even every candidate float misses it (other quantized ops, or a
   metric no float layer can satisfy), the best model scored (all-INT8, every gaining layer
   float, every candidate float) is kept and the result says the target was not met;
3. each kept layer, least gain first, is dropped again when the target holds without it.

With ``target_cost: macs`` :mod:`onnxq.mixed.float_cost` chooses too; with ``target_max_float_macs``
a choice over that ceiling is made again within it (:mod:`onnxq.mixed.float_budget`); where the run
writes the choice with statistics of its own (prefix calibration), :mod:`onnxq.mixed.confirm`
checks it with them.  The verdict (``score``, ``met``) is measured on the model the run writes,
recovery included (:meth:`MixedPrecision.as_written`).

The chosen layers stay float through the normal placement machinery: they are exclusions with
a reason (their sensitivity) passed to :func:`onnxq.place.loop.place`, and only
``materialize`` writes Q/DQ.  The held-out batches are the first ``heldout_batches`` batches
of the calibration data, which calibration then skips (at most a quarter of a source whose
length is known), or an explicit source (:func:`hold_out`).

The run calls :func:`target_search`, which brings the recovery steps its trials need (AdaRound's
weights learned once, quantized-prefix statistics); ``onnxq analyze --sensitivity`` calls
:func:`sensitivity_ranking`.  Both start from the run's first half
(:func:`onnxq.mixed.front.float_graph`), so they rank the graph that quantize writes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.backends.runs import run_outputs
from onnxq.calibrate.measure import statistics_source
from onnxq.config.recipes import ActivationRecipe
from onnxq.ir.ops import WEIGHTED_OPS
from onnxq.mixed.confirm import confirm
from onnxq.mixed.float_budget import ceiling, ceiling_warning, within_ceiling
from onnxq.mixed.float_cost import choose_by_macs, layer_neighbours, macs_known, placement_cost
from onnxq.mixed.front import FloatGraph, float_graph
from onnxq.mixed.heldout import HeldOut
from onnxq.mixed.record import MixedPrecision, summary_lines
from onnxq.mixed.sensitivity import (
    LayerSensitivity,
    Trials,
    candidates,
    layer_macs,
    rank_layers,
)
from onnxq.mixed.trials import score_model
from onnxq.numerics.accuracy_target import AccuracyTarget, parse_target
from onnxq.place.annotations import Annotations
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import Placement, Statistics, place
from onnxq.recover.adaround import ChosenWeight
from onnxq.recover.confirm import Measure, written_statistics
from onnxq.recover.stages import measured_qparams, search_statistics
from onnxq.recover.trial_weights import trial_weights
from onnxq.scale.executor import Executor


def accuracy_target(text: str | None, given: AccuracyTarget | str | None) -> AccuracyTarget | None:
    """The run's target: ``given`` (the API's ``target=``) or the config's string."""
    if isinstance(given, AccuracyTarget):
        return given
    if given is not None:
        return parse_target(given, "target")
    return parse_target(text, "target_accuracy") if text is not None else None


def reason(layer: LayerSensitivity, target: AccuracyTarget) -> str:
    """Why a layer stays float, for the report's decisions."""
    head = f"kept float for the accuracy target {target.describe()}: float alone it "
    if layer.gain > 0:
        return head + f"raises {target.name} by {layer.gain:.3g} on the held-out batches"
    return head + (
        f"changes {target.name} by {layer.gain:.3g} on the held-out batches, but with the "
        "other float layers the target does not hold without it"
    )


def find_mixed_precision(
    trials: Trials,
    first: Placement[Any],
    heldout: str,
    progress: bool,
    remeasure: Callable[[Placement[Any]], Measure] | None = None,
) -> MixedPrecision:
    """Rank the layers of ``first`` (the all-INT8 placement), choose the layers to keep float
    (see the module), and place again with them as exclusions; ``heldout`` says where the
    held-out batches came from; ``remeasure``: the statistics the run writes a placement with,
    where they are not the trials' (:func:`onnxq.recover.confirm.written_statistics`)."""
    base, ranking = rank_layers(trials, candidates(first.annotations), progress)
    cost = trials.config.accuracy.target_cost if macs_known(ranking) else "layers"
    kept = choose(trials, base, ranking, cost)
    share = trials.config.accuracy.target_max_float_macs
    every, int8_float = model_macs(trials.facts.graph, first.annotations)
    note = None if share is None else ceiling_warning(share, every, int8_float)
    limit = ceiling(share, every if macs_known(ranking) else None)
    kept = within_ceiling(trials, base, ranking, kept, limit)
    confirmations = 0
    if remeasure is not None and trials.target.met(trials.score(s.node for s in kept)):
        kept, confirmations = confirm(trials, kept, ranking, limit, remeasure)
    reasons = {s.node: reason(s, trials.target) for s in kept}
    score = trials.score(reasons)
    final = trials.placement(reasons)
    _, left_float = model_macs(trials.facts.graph, final.annotations)
    return MixedPrecision(
        trials.target,
        heldout,
        base,
        score,
        tuple(kept),
        tuple(ranking),
        trials.count,
        final,
        every,
        left_float,
        cost,
        share,
        note,
        confirmations=confirmations,
    )


def model_macs(graph: ir.Graph, annotations: Annotations) -> tuple[int | None, int | None]:
    """Multiply-adds per sample of the model's Conv/ConvTranspose/Gemm/MatMul, and of those
    ``annotations`` leave float (None: a shape is not static)."""
    quantized = {d.node for d in annotations.decisions if d.quantized}
    every = left_float = 0
    for node in graph.nodes:
        if node.op_type not in WEIGHTED_OPS:
            continue
        macs = layer_macs(graph, node)
        if macs is None:
            return None, None
        every += macs
        left_float += 0 if node.name in quantized else macs
    return every, left_float


def search(
    target: AccuracyTarget,
    heldout: HeldOut,
    model: onnx.ModelProto,
    facts: GraphFacts,
    profile: BackendProfile,
    config: ActivationRecipe,
    measure: Callable[[Mapping[str, bool]], Statistics],
    first: Placement[Any],
    executor: Executor | None = None,
    remeasure: Callable[[Placement[Any]], Measure] | None = None,
    chosen: Mapping[str, ChosenWeight] | None = None,
) -> MixedPrecision:
    """The pipeline's entry: trials over ``model`` (the prepared float model, not edited)
    with the statistics ``measure`` has cached, scored against the float model's outputs on
    the held-out batches, then :func:`find_mixed_precision` (``remeasure``: see there); the
    trials run on ``executor`` (:mod:`onnxq.scale`; None: in this process), with the same
    scores; ``chosen``: integer weights every trial uses, by weight tensor
    (:func:`onnxq.recover.trial_weights.trial_weights`; None: round-to-nearest)."""
    reference = run_outputs(model, heldout.batches, profile.fused_validation, "float")
    trials = Trials(
        model, facts, profile, config, measure, heldout.batches, reference, target,
        executor=executor, chosen=dict(chosen or {}),
    )  # fmt: skip
    found = find_mixed_precision(
        trials, first, heldout.source, config.calibration.progress, remeasure
    )
    return replace(found, rescore=functools.partial(score_model, trials.context()))


def choose(
    trials: Trials, base: float, ranking: list[LayerSensitivity], cost: str = "layers"
) -> list[LayerSensitivity]:
    """The layers to keep float: see steps 1-3 of the module (``ranking``: largest gain
    first; layers that gain nothing are tried last); with ``cost`` ``macs``, the one of
    those layers and :func:`onnxq.mixed.float_cost.choose_by_macs`'s with fewer multiply-adds."""
    target = trials.target
    if target.met(base):
        return []

    def score(layers: list[LayerSensitivity]) -> float:
        return trials.score(s.node for s in layers)

    if not target.met(score(ranking)):
        gaining = [s for s in ranking if s.gain > 0]
        tried = [[], gaining, ranking]
        return max(tried, key=lambda layers: (score(layers), -len(layers)))
    low, high = 0, len(ranking)  # the prefix of length `high` meets the target, `low` not
    while high - low > 1:
        middle = (low + high) // 2
        if target.met(score(ranking[:middle])):
            high = middle
        else:
            low = middle
    kept = ranking[:high]
    for layer in sorted(kept, key=lambda s: s.gain):
        rest = [s for s in kept if s is not layer]
        if rest and target.met(score(rest)):
            kept = rest
    if cost == "macs":
        near = layer_neighbours(trials.facts.graph, (s.node for s in ranking))
        cheaper = choose_by_macs(trials, base, ranking, near)
        by_placement = placement_cost(trials)
        return min([cheaper, kept], key=lambda layers: (by_placement(layers), len(layers)))
    return kept


def target_search(
    target: AccuracyTarget,
    front: FloatGraph,
    config: ActivationRecipe,
    measure: Measure,
    first: Placement[Any],
    executor: Executor | None = None,
) -> tuple[MixedPrecision, dict[str, ChosenWeight] | None]:
    """The run's ``--target`` search over the graph of ``front`` from the all-INT8 placement
    ``first`` (calibrated by ``measure``), with the recovery steps its trials need: AdaRound's
    weights learned once for every trial (also returned, for the run to write; None: none
    learned before), the trials' quantized-prefix statistics, and the statistics the run
    writes a placement with (:mod:`onnxq.recover.trial_weights`, :mod:`onnxq.recover.confirm`)."""
    steps, model = front.steps, front.prepared.model
    assert front.heldout is not None  # float_graph(..., hold=True)
    learned = trial_weights(steps, model, first.annotations)
    searched = search_statistics(steps, model, measure, first.annotations, first.statistics)
    written = written_statistics(steps, model, searched, functools.partial(measured_qparams, steps))
    found = search(
        target, front.heldout, model, front.facts, front.profile, config, searched, first,
        executor, written, learned,
    )  # fmt: skip
    return found, learned


def sensitivity_ranking(
    model: Any, calibration: Any, config: ActivationRecipe
) -> tuple[HeldOut, float, list[LayerSensitivity]]:
    """Calibrate ``model`` once as :func:`onnxq.quantize` would with ``config`` (the same
    first half, :func:`onnxq.mixed.front.float_graph`: the float rewrites included) and rank
    its quantized layers by sensitivity (``onnxq analyze --sensitivity``): the held-out
    batches, the all-INT8 score of the config's target (cosine when it has none), and the
    ranking."""
    target = accuracy_target(config.accuracy.target_accuracy, None) or AccuracyTarget("cosine", 1.0)
    front = float_graph(model, config, calibration, hold=True)
    held, graph_model, profile = front.heldout, front.prepared.model, front.profile
    assert held is not None
    measure = statistics_source(
        graph_model, front.facts, profile, front.data, front.inputs, config.calibration, False, None
    )
    first = place(front.facts, profile, config.placement, measure)
    reference = run_outputs(graph_model, held.batches, profile.fused_validation, "float")
    trials = Trials(
        graph_model, front.facts, profile, config, measure, held.batches, reference, target
    )
    base, ranking = rank_layers(trials, candidates(first.annotations), config.calibration.progress)
    return held, base, ranking


__all__ = [
    "MixedPrecision",
    "accuracy_target",
    "choose",
    "find_mixed_precision",
    "model_macs",
    "search",
    "sensitivity_ranking",
    "summary_lines",
    "target_search",
]
