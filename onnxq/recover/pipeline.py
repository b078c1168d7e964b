"""Accuracy recovery as the run calls it: once before calibration, once after.

* :func:`before_calibration`: the exact float rewrites of the model (CLE, depthwise
  equalization, SmoothQuant; :func:`onnxq.recover.stages.rewrite_float`);
* :func:`after_calibration`: everything that needs the statistics, in this order: the
  quantized-prefix ranges (``calibration_mode: prefix``), the range search, AdaRound's
  integer weights, bias correction, then the sequential correction.  Each step starts from
  what the one before chose; the result (:class:`Recovered`) is what ``materialize`` writes.

The ``--target`` search's own uses of these steps (AdaRound's weights learned once for its
trials, its trials' prefix statistics) are :func:`onnxq.mixed.search.target_search`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from onnxq.calibrate.engine import CalibrationResult
from onnxq.calibrate.ranges import ActivationRanges
from onnxq.config.placement import PlacementOptions
from onnxq.place.annotations import Annotations
from onnxq.recover.adaround import ChosenWeight
from onnxq.recover.bias_correction import BiasCorrectionPass, bias_correction_pass
from onnxq.recover.stages import (
    Steps,
    correct_sequentially,
    measured_ranges,
    recalibrate,
    rewrite_float,
    search_ranges,
)
from onnxq.recover.trial_weights import written_weights


@dataclass(frozen=True)
class Recovered:
    """What the steps after calibration chose: the statistics the ranges come from (the
    quantized-prefix ones, when measured), the activation ranges (searched, when asked), the
    integer weights decided before ``materialize`` (AdaRound's; empty: round to nearest), and
    the bias correction's pass (None: not asked, or no data)."""

    statistics: CalibrationResult
    ranges: ActivationRanges
    chosen: dict[str, ChosenWeight]
    bias: BiasCorrectionPass | None


def before_calibration(
    steps: Steps, model: onnx.ModelProto, placement: PlacementOptions, cached: bool
) -> onnx.ModelProto:
    """``model`` after the exact float rewrites the options ask for (``cached``: the run saves
    or loads a calibration cache, and they are skipped; see
    :func:`~onnxq.recover.stages.rewrite_float`)."""
    return rewrite_float(steps, model, placement, cached=cached)


def after_calibration(
    steps: Steps,
    model: onnx.ModelProto,
    annotations: Annotations,
    statistics: CalibrationResult,
    learned: dict[str, ChosenWeight] | None = None,
) -> Recovered:
    """The recovery steps that need the statistics, run on ``model`` (its biases corrected in
    place) for the placement ``annotations`` calibrated as ``statistics``; ``learned``:
    AdaRound's weights learned before a ``--target`` search
    (:func:`onnxq.recover.trial_weights.trial_weights`; None: learned here, when asked)."""
    ranges = measured_ranges(steps, annotations, statistics)
    again = recalibrate(steps, model, annotations, ranges.qparams, statistics)
    if again is not None:  # quantized-prefix ranges
        statistics = again
        ranges = measured_ranges(steps, annotations, statistics)
    searched = search_ranges(steps, model, annotations, ranges.qparams, statistics)
    ranges = replace(ranges, qparams=searched)
    chosen = written_weights(steps, model, annotations, ranges.qparams, learned)
    bias = None
    if steps.bias_correction and steps.data is not None:
        bias = bias_correction_pass(
            model, annotations, steps.profile, steps.weights, steps.data, steps.inputs,
            steps.calibration.max_batches, chosen,
        )  # fmt: skip
    correct_sequentially(steps, model, annotations, ranges.qparams, chosen)
    return Recovered(statistics, ranges, chosen, bias)


__all__ = ["Recovered", "after_calibration", "before_calibration"]
