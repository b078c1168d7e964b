"""Output-driven range search: each activation's clip range chosen by the model's output error,
one tensor at a time in graph order (``range_search: true``).

An observer (and quantized-prefix calibration) picks each activation's range from that
tensor's own values: the error it minimises, or the share it keeps, is local.  What matters is
the model's output: a range clipped 20% tighter costs a few large values and gives every other
value a finer step, and which way that goes depends on what the layers after it do with them.
Here, for each quantized activation in graph order, with every earlier range already chosen,
the current range (``f = 1``) and a small grid of others (the current one times each of
:data:`FACTORS`, and the ``mse`` observer's range of the same statistics) are tried, and the
one with the least model output error (per output, the mean over samples of the squared error
over the float output's squared norm, padded positions left out, summed over the outputs) on
the even calibration batches is taken; it is kept only if it lowers that error on the odd
batches by more than :data:`MIN_SIGNIFICANCE` standard errors of the batch-to-batch
differences (the even/odd pattern of sequential AdaRound and sequential bias correction).  A
range never passes the bounds its readers saturate at.

Cost, per tensor: the Q/DQ model up to the tensor runs once per calibration batch (its
activations, and whatever else the rest of the model reads from before it, are the inputs of
the rest: :func:`onnxq.ir.split.cut_after`, :mod:`onnxq.recover.rangeerror`), and the rest of
the model once per candidate on each even batch and twice on each odd one when a candidate
wins there, all streamed one batch at a time.  About ``(1 + candidates / 2)`` passes over the
data per tensor (the part after a tensor is on average half the model); the float outputs of
the calibration batches are kept under ``memory_budget_mb`` (later batches are not used).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx

from onnxq.backends.profile import BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.numerics.observers import MethodOptions
from onnxq.numerics.precisions import tensor_qtype
from onnxq.numerics.qparams import QParams, activation_qparams
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.annotations import Annotations, TensorAnnotation
from onnxq.recover.rangeerror import FloatOutputs, SuffixRunner
from onnxq.recover.rangegrid import Candidate, Grid, candidates
from onnxq.runtime.progress import counted

FACTORS = (1.2, 0.9, 0.8, 0.7, 0.6, 0.5)  # the current range times each, besides 1 and mse
# a range is kept when its gain on the judging batches exceeds this many standard errors
MIN_SIGNIFICANCE = 2.0


@dataclass(frozen=True)
class RangeChoice:
    """One tensor: the range tried best on the fitting batches (``label``: ``x0.8``, ``mse``,
    ``x1`` when the current one stayed best), the model's output error with the current
    range and that one on the fitting and the judging batches, and whether it was kept."""

    tensor: str
    label: str
    factor: float  # the chosen range's high end over the current one's
    low: float
    high: float
    fit_before: float
    fit_after: float
    judge_before: float | None = None  # None: nothing better on the fitting batches
    judge_after: float | None = None
    kept: bool = False

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "tensor": self.tensor,
            "candidate": self.label,
            "factor": round(self.factor, 4),
            "range": [_g(self.low), _g(self.high)],
            "error_fit": [_g(self.fit_before), _g(self.fit_after)],
            "error_judge": [_g(self.judge_before), _g(self.judge_after)],
            "kept": self.kept,
        }


def _g(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def search_ranges(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    stats: dict[str, TensorStats],
    profile: BackendProfile,
    weights: WeightOptions,
    calibration: CalibrationOptions,
    reference: FloatOutputs,
) -> tuple[dict[str, QParams], list[RangeChoice]]:
    """The activation ranges of ``model`` (the float model, not edited) chosen one tensor at
    a time in graph order by the model's output error against ``reference`` (``qparams``:
    the observers' ranges, where every search starts; returned with the kept changes), and
    one record per tensor searched, in graph order."""
    from onnxq.materialize.qdq import materialize

    current = dict(qparams)
    done: list[RangeChoice] = []
    order = _in_graph_order(model, annotations, current)
    for ann in counted(order, "range search", calibration.progress, len(order), unit="tensor"):
        spec = _grid_of(ann, profile)
        grid = candidates(
            current[ann.tensor], FACTORS, spec, ann.bounds, _mse_range(ann, spec, stats)
        )
        if len(grid) < 2:
            continue
        quantized = onnx.ModelProto()
        quantized.CopyFrom(model)
        materialize(quantized, annotations, current, profile, weights)
        site = SuffixRunner.at(quantized, ann.tensor)
        if site is None:
            continue
        choice = _choose(site, grid, reference, ann.tensor)
        if choice.kept:
            current[ann.tensor] = grid[[c.label for c in grid].index(choice.label)].qparams
        done.append(choice)
    return current, done


def _choose(
    site: SuffixRunner, grid: list[Candidate], reference: FloatOutputs, tensor: str
) -> RangeChoice:
    """The best of ``grid`` (the current range first) on the even batches, judged on the
    odd ones (:func:`significantly_lower`)."""
    fit = site.errors(grid, reference.batches(0)).mean(axis=1)
    best = int(np.argmin(fit))
    chosen = grid[best]
    record = RangeChoice(
        tensor, chosen.label, chosen.factor, chosen.qparams.low, chosen.qparams.high,
        float(fit[0]), float(fit[best]),
    )  # fmt: skip
    if best == 0:
        return record
    judged = site.errors([grid[0], chosen], reference.batches(1))
    before, after = (float(v) for v in judged.mean(axis=1))
    return replace(
        record, judge_before=before, judge_after=after,
        kept=significantly_lower(judged[1], judged[0]),
    )  # fmt: skip


def significantly_lower(new: np.ndarray, old: np.ndarray) -> bool:
    """Whether the per-batch errors ``new`` are lower than ``old`` (paired, batch by batch)
    by more than :data:`MIN_SIGNIFICANCE` standard errors of their mean difference (with one
    batch: lower at all)."""
    gain = old - new
    if gain.size < 2:
        return bool(gain.sum() > 0)
    spread = float(gain.std(ddof=1)) / np.sqrt(gain.size)
    return bool(gain.mean() > MIN_SIGNIFICANCE * spread) and bool(gain.mean() > 0)


def _grid_of(ann: TensorAnnotation, profile: BackendProfile) -> Grid:
    """``ann``'s element type, symmetry and bits, as :mod:`onnxq.calibrate.ranges` gives them."""
    qtype = tensor_qtype("activation", ann.settings.precision, profile.activation_dtype)
    symmetric = ann.settings.symmetric
    symmetric = profile.activation_symmetric if symmetric is None else symmetric
    return Grid(qtype.name, symmetric, ann.settings.bits)


def _mse_range(ann: TensorAnnotation, grid: Grid, stats: dict[str, TensorStats]) -> QParams | None:
    """The ``mse`` observer's range of ``ann``'s statistics (None: no histogram)."""
    seen = stats.get(ann.tensor)
    if seen is None or not seen.histogram or seen.count == 0:
        return None
    return activation_qparams(
        seen, "mse", grid.dtype, grid.symmetric, MethodOptions(), grid.bits, ann.bounds
    )


def _in_graph_order(
    model: onnx.ModelProto, annotations: Annotations, qparams: dict[str, QParams]
) -> list[TensorAnnotation]:
    """The annotated activations that have integer qparams and are not shifted, by their
    producer's place in ``model`` (graph inputs first)."""
    place = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    anns = [
        a
        for a in annotations.of_kind("activation")
        if a.tensor in qparams
        and qparams[a.tensor].zero_point.dtype.kind in "iu"
        and not a.shift  # a shifted tensor's pair reads x - c, not x: no candidate fits it
    ]
    return sorted(anns, key=lambda a: place.get(a.tensor, -1))


__all__ = ["FACTORS", "RangeChoice", "search_ranges", "significantly_lower"]
