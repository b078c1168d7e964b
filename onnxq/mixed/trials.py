"""One sensitivity trial as an executor task (:mod:`onnxq.scale`): materialize a placement into
a copy of the float model, run it on the held-out batches, and score it.

The driver (:class:`onnxq.mixed.sensitivity.Trials`) places each trial (the placement loop over the
cached statistics) and computes its activation qparams; what a trial needs beyond that is the
same for every trial and travels once per worker as a :class:`TrialContext`: the prepared float
model, the held-out batches, the float model's outputs on them and the target.  A trial's shard
(:class:`TrialShard`) is the placement's annotations and activation qparams (a few KiB to a few
hundred KiB: one record per tensor, no weights, no activations), and its result is one float.
The same two functions run in this process (:class:`~onnxq.scale.executor.InProcess`) and on a
Ray worker, so a trial scores the same wherever it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxq.backends.profile import BackendProfile
from onnxq.backends.runs import padding_masks, run_outputs
from onnxq.config.options import WeightOptions
from onnxq.data.inputs import Batch
from onnxq.materialize.qdq import materialize
from onnxq.numerics.accuracy_target import AccuracyTarget, Outputs
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations


@dataclass(frozen=True)
class TrialContext:
    """What every trial of one search needs (sent once per worker): the prepared float model
    (never edited), the held-out batches, the float model's outputs on them, the target, the
    backend profile, the weight options and the integer weights chosen before the search
    (weight tensor -> (qparams, integers): AdaRound's, :mod:`onnxq.recover.trial_weights`;
    empty: round-to-nearest)."""

    model: onnx.ModelProto
    heldout: list[Batch]
    reference: Outputs
    target: AccuracyTarget
    profile: BackendProfile
    weights: WeightOptions
    chosen: Mapping[str, tuple[QParams, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialShard:
    """One trial: the settled placement's annotations and its activation qparams."""

    annotations: Annotations
    qparams: dict[str, QParams]


@dataclass(frozen=True)
class TrialWorker:
    """A worker's state for one search: the context and the held-out batches' padding masks."""

    context: TrialContext
    masks: list[np.ndarray | None]


def trial_worker(context: TrialContext) -> TrialWorker:
    """The executor's ``setup``: a worker's state for ``context``."""
    return TrialWorker(context, padding_masks(context.heldout))


def score_trial(worker: TrialWorker, shard: TrialShard) -> float:
    """The executor's ``task``: the target metric of the model quantized as ``shard`` places
    it, on the held-out batches."""
    context = worker.context
    trial = onnx.ModelProto()
    trial.CopyFrom(context.model)
    materialize(
        trial, shard.annotations, shard.qparams, context.profile, context.weights, context.chosen
    )
    return _scored(context, trial, worker.masks, "trial")


def score_model(context: TrialContext, model: onnx.ModelProto) -> float:
    """The target metric of ``model``, a quantized model of ``context``'s float one (the
    model a run writes, after its recovery steps), on the held-out batches."""
    return _scored(context, model, padding_masks(context.heldout), "quantized")


def _scored(
    context: TrialContext, model: onnx.ModelProto, masks: list[np.ndarray | None], label: str
) -> float:
    fused = context.profile.fused_validation
    outputs = run_outputs(model, context.heldout, fused, label, ours=True)
    return float(context.target.evaluate(context.reference, outputs, masks))


__all__ = [
    "TrialContext",
    "TrialShard",
    "TrialWorker",
    "score_model",
    "score_trial",
    "trial_worker",
]
