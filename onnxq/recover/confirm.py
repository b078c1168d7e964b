"""The statistics a placement is written with, for the ``--target`` search to confirm its
choice (:mod:`onnxq.mixed.confirm`).

With ``calibration_mode: prefix`` the search's trials share one set of quantized-prefix
ranges, measured with the all-INT8 placement quantized (:func:`onnxq.recover.stages.
search_statistics`), while the run writes the chosen placement with ranges measured again with
*its* prefix quantized, some layers float (:func:`onnxq.recover.stages.recalibrate`): the two
differ by a few 1e-4 of cosine on mobilenet_v2.  :func:`written_statistics` gives the search
a way to measure what the run will write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import onnx

from onnxq.calibrate.engine import CalibrationResult
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.place.loop import Placement
from onnxq.recover.prefix import prefix_calibrate
from onnxq.recover.stages import Overlaid, Steps

Measure = Callable[[Mapping[str, bool]], CalibrationResult]


def written_statistics(
    steps: Steps,
    model: onnx.ModelProto,
    searched: Measure,
    qparams_of: Callable[[Annotations, CalibrationResult], dict[str, QParams]],
) -> Callable[[Placement[Any]], Measure] | None:
    """For a placement the search settled with ``searched`` (its trials' ``measure``), the
    ``measure`` whose statistics are those the run writes it with: its own quantized-prefix
    ones, as :func:`onnxq.recover.stages.recalibrate` measures them; None when the run writes
    the search's statistics (no prefix calibration, or it could not run: ``searched`` is then
    not an :class:`~onnxq.recover.stages.Overlaid`).  ``qparams_of(annotations, result)``
    turns statistics into activation ranges, as the pipeline does."""
    if steps.options.calibration_mode != "prefix" or not isinstance(searched, Overlaid):
        return None
    data = steps.data
    assert data is not None  # the search's prefix statistics read it

    def remeasure(placement: Placement[Any]) -> Measure:
        annotations, first = placement.annotations, placement.statistics
        again = prefix_calibrate(
            model, annotations, qparams_of(annotations, first), first, steps.profile,
            steps.calibration, steps.weights, data, steps.inputs,
            lambda measured: qparams_of(annotations, measured),
        )  # fmt: skip
        return Overlaid(searched, again)

    return remeasure


__all__ = ["Measure", "written_statistics"]
