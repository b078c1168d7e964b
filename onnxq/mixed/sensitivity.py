"""Per-layer sensitivity: how much the accuracy metric gains when one layer alone stays float.

Nothing is calibrated again.  A :class:`Trials` holds what one calibration produced (the graph
facts and the placement loop's ``measure``, whose statistics are cached) and scores a set of
nodes kept float: the normal placement loop runs with those nodes as exclusions
(:func:`onnxq.place.loop.place` ``kept``), the activation ranges come from the cached
statistics, ``materialize`` writes the Q/DQ into a copy of the float model, and onnxruntime
runs it on the held-out batches; the metric compares its outputs with the float model's.

Cost: :func:`rank_layers` scores the all-INT8 model once and each of the L candidate layers
(quantized Conv/ConvTranspose/Gemm/MatMul) once, so L + 1 trials; a trial costs one placement
(graph walk), one copy + materialize, one onnxruntime session and the held-out batches through
the whole model.  For a fixed model the time grows linearly with the number of layers
(``scripts/bench_sensitivity.py`` prints it).

Where: this process places each trial and computes its qparams; materializing, running and
scoring it is a task (:mod:`onnxq.mixed.trials`) of the trials' executor (:mod:`onnxq.scale`:
here by default, Ray tasks with ``--ray``), which runs the ranking's L + 1 trials together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.calibrate.ranges import activation_ranges
from onnxq.config.recipes import ActivationRecipe
from onnxq.data.inputs import Batch
from onnxq.ir.ops import WEIGHTED_OPS  # the layers the search may keep float (most MACs)
from onnxq.mixed.trials import TrialContext, TrialShard, score_trial, trial_worker
from onnxq.numerics.accuracy_target import AccuracyTarget, Outputs
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations, Excluded
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import Placement, Statistics, place
from onnxq.place.macs import layer_macs, static_shape
from onnxq.runtime.progress import counted
from onnxq.scale.executor import Executor, InProcess

TRIAL_REASON = "kept float for the sensitivity trial"


@dataclass
class Trials:
    """Scores placements of one model that keep given nodes float, from one calibration.

    ``model`` is the prepared float model (never edited: each trial materializes a copy);
    ``reference`` the float model's outputs on ``heldout``.
    """

    model: onnx.ModelProto
    facts: GraphFacts
    profile: BackendProfile
    config: ActivationRecipe
    measure: Callable[[Mapping[str, bool]], Statistics]
    heldout: list[Batch]
    reference: Outputs
    target: AccuracyTarget
    count: int = 0
    scores: dict[frozenset[str], float] = field(default_factory=dict)
    # multiply-adds left float by the placement of each set of float nodes (float_macs)
    macs: dict[frozenset[str], int | None] = field(default_factory=dict)
    # activation qparams by (tensor, method, settings, bounds): computed once, reused by
    # every trial (the ``auto`` method's search over a histogram is most of a trial's time)
    qparams: dict[tuple[object, ...], QParams | None] = field(default_factory=dict)
    # where the trials run (onnxq.scale: a Ray cluster); None: in this process
    executor: Executor | None = None
    # integer weights chosen before the search, by weight tensor (AdaRound's in ``float``
    # mode: onnxq.recover.trial_weights); empty: every trial rounds to nearest
    chosen: Mapping[str, tuple[QParams, np.ndarray]] = field(default_factory=dict)
    _context: TrialContext | None = field(default=None, repr=False)

    def placement(self, kept: Mapping[str, str]) -> Placement[Any]:
        """The settled placement with the nodes of ``kept`` (name -> reason) float."""
        return place(
            self.facts, self.profile, self.config.placement, self.measure, kept=Excluded(nodes=kept)
        )

    def float_macs(self, nodes: Iterable[str]) -> int | None:
        """Multiply-adds per sample of the Conv/ConvTranspose/Gemm/MatMul that the settled
        placement with ``nodes`` float leaves out of INT8, for any reason: a float layer can
        take a neighbour's Q/DQ, and so its INT8 kernel, with it (memoized; None: a shape is
        not static)."""
        key = frozenset(nodes)
        if key not in self.macs:
            decisions = self.placement(dict.fromkeys(sorted(key), TRIAL_REASON)).annotations
            quantized = {d.node for d in decisions.decisions if d.quantized}
            graph = self.facts.graph
            total: int | None = 0
            for node in graph.nodes:
                if node.op_type in WEIGHTED_OPS and node.name not in quantized:
                    macs = layer_macs(graph, node)
                    total = None if macs is None or total is None else total + macs
            self.macs[key] = total
        return self.macs[key]

    def score(self, nodes: Iterable[str]) -> float:
        """The target metric on the held-out batches with ``nodes`` float (memoized)."""
        return self.score_all([nodes])[0]

    def score_all(self, sets: Iterable[Iterable[str]], progress: bool = False) -> list[float]:
        """The scores of ``sets`` of float nodes (memoized), the trials not scored yet run
        through the executor (:mod:`onnxq.mixed.trials`; in this process when it has none),
        placed here as the executor asks for them; ``progress``: a bar of trials."""
        keys = [frozenset(nodes) for nodes in sets]
        todo = list(dict.fromkeys(key for key in keys if key not in self.scores))
        if todo:
            executor = self.executor if self.executor is not None else InProcess()
            shards = (self.shard(key) for key in todo)
            scored = executor.map(score_trial, trial_worker, self.context(), shards)
            with contextlib.closing(scored):  # an error, Ctrl-C: the rest is cancelled
                for key, score in zip(todo, _progress(scored, len(todo), progress), strict=True):
                    self.scores[key] = score
                    self.count += 1
        return [self.scores[key] for key in keys]

    def context(self) -> TrialContext:
        """What every trial needs (made once: an executor sends it once per worker)."""
        if self._context is None:
            self._context = TrialContext(
                self.model,
                self.heldout,
                self.reference,
                self.target,
                self.profile,
                self.config.weights,
                self.chosen,
            )
        return self._context

    def shard(self, key: frozenset[str]) -> TrialShard:
        """The trial with the nodes of ``key`` float: its placement and activation qparams."""
        placement = self.placement(dict.fromkeys(sorted(key), TRIAL_REASON))
        return TrialShard(placement.annotations, self.activation_qparams(placement))

    def activation_qparams(self, placement: Placement[Statistics]) -> dict[str, QParams]:
        """The placement's activation qparams, each computed from the statistics once."""
        activations = placement.annotations.of_kind("activation")
        keys = {a.tensor: (a.tensor, a.method, a.settings, a.bounds) for a in activations}
        missing = {a.tensor: a for a in activations if keys[a.tensor] not in self.qparams}
        if missing:
            ranges = activation_ranges(
                Annotations(missing, []),
                placement.statistics.stats,
                self.profile,
                self.config.calibration.percentile,
            )
            for tensor in missing:
                self.qparams[keys[tensor]] = ranges.qparams.get(tensor)
        found = {t: self.qparams[key] for t, key in keys.items()}
        return {t: qp for t, qp in found.items() if qp is not None}


@dataclass(frozen=True)
class LayerSensitivity:
    """One candidate layer: the metric with it alone float (``alone``), what that gains over
    the all-INT8 model (``gain``), and what keeping it float costs: its multiply-adds per
    sample and the activation values per sample a float island converts at its edges (a
    QuantizeLinear/DequantizeLinear pass each where the backend runs Q/DQ as ops); None where
    shapes are not static."""

    node: str
    op_type: str
    alone: float
    gain: float
    macs: int | None
    qdq_elements: int | None

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "node": self.node,
            "op_type": self.op_type,
            "score_float_alone": _rounded(self.alone),
            "gain": _rounded(self.gain),
            "macs": self.macs,
            "qdq_elements": self.qdq_elements,
        }


def _rounded(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def candidates(annotations: Annotations) -> list[tuple[str, str]]:
    """The quantized layers the search may keep float: (node, op type), in graph order."""
    return [
        (d.node, d.op_type)
        for d in annotations.decisions
        if d.quantized and d.op_type in WEIGHTED_OPS and d.rule != "fused"
    ]


def rank_layers(
    trials: Trials, layers: list[tuple[str, str]], progress: bool = False
) -> tuple[float, list[LayerSensitivity]]:
    """The all-INT8 score and each layer's sensitivity, most harmful (largest gain) first;
    ties in graph order.  The L + 1 trials are independent: they run together on the
    trials' executor."""
    base, *alone = trials.score_all([(), *((node,) for node, _ in layers)], progress)
    graph = trials.facts.graph
    ranked = []
    for (node, op_type), score in zip(layers, alone, strict=True):
        proto = graph.node_by_name(node)
        macs = layer_macs(graph, proto) if proto is not None else None
        edges = boundary_elements(graph, proto) if proto is not None else None
        ranked.append(LayerSensitivity(node, op_type, score, score - base, macs, edges))
    order = {name: i for i, (name, _) in enumerate(layers)}
    ranked.sort(key=lambda s: (-s.gain if math.isfinite(s.gain) else math.inf, order[s.node]))
    return base, ranked


def _progress(scores: Iterator[float], total: int, enabled: bool) -> Iterator[float]:
    """``scores``, with a bar of the trials done when ``enabled`` and there are several."""
    return counted(scores, "sensitivity", enabled and total >= 2, total, unit="trial")


def boundary_elements(graph: ir.Graph, node: onnx.NodeProto) -> int | None:
    """Activation values per sample at the edges of ``node`` alone float: its non-constant
    inputs and its output (each needs a DequantizeLinear or a QuantizeLinear)."""
    total = 0
    for name in [*(i for i in node.input if i and not graph.is_const(i)), node.output[0]]:
        shape = static_shape(graph.shape(name))
        if shape is None:
            return None
        total += math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    return total


__all__ = [
    "LayerSensitivity",
    "Trials",
    "boundary_elements",
    "candidates",
    "rank_layers",
]
