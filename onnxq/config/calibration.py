"""The calibration section: how the batches are read (batch size, preprocessing, how many, how
many kept for the fidelity check), observed (memory budget, histogram sampling), turned into
ranges (the percentile), cached (saved or loaded statistics) and shown (progress bars).

Read by calibration (``onnxq.calibrate``), by the recovery steps that observe the model again
(``onnxq.recover``) and by a weight-only run's data reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from onnxq.config.fields import Section, must, option, preprocess_spec


def _path(value: Any, _: str) -> str | None:
    """A path field's value as text (a ``Path`` from Python becomes its string)."""
    return None if value is None else os.fspath(value)


@dataclass(frozen=True)
class CalibrationOptions(Section):
    """How the calibration batches are read, observed, cached and shown.

    Attributes:
        percentile: the percentile kept by the ``percentile`` method (0 < p <= 100).
        max_batches: use at most this many calibration batches (``None``: all).
        batch_size: the batch size when the calibration data is one ``.npz`` of samples
            (a leading sample axis).
        fidelity_batches: how many calibration batches are kept to measure the quantized model
            against the float model.
        memory_budget_mb: activations of one batch that calibration may hold at once; when
            the observed tensors need more, they are observed in groups, one pass each.
        histogram_sample: values per sample that go into a tensor's histogram: a sample with
            more contributes every s-th value (s prime, coprime to its dimensions); min/max
            always see every value; 0 puts every value in the histogram (slower).
        histogram_budget: values that one tensor's histogram counts over the whole
            calibration: with more samples than ``histogram_budget / histogram_sample``, each
            sample contributes fewer values (its share, rounded down to a power of two, at
            least 1024); 0: no budget.  Calibrations of up to 256 samples are not affected.
        preprocess: how a folder of images becomes model inputs: a preset (``imagenet``,
            ``0-1``, ``tf``) or a spec (docs/calibration.md); in YAML also a mapping.
        progress: show progress bars on stderr.
        save_calibration: write the observed statistics to this JSON file (histograms for
            every tensor, so any ``method`` can be used when it is loaded; ``None``: not saved).
        load_calibration: quantize from statistics saved earlier (``save_calibration``)
            instead of data; the calibration data is then optional and, if given, only feeds
            the fidelity check.
    """

    percentile: float = option(99.99, must(lambda v: 0.0 < v <= 100.0, "be in (0, 100]"))
    max_batches: int | None = option(None, must(lambda v: v >= 1, "be >= 1"))
    batch_size: int = option(1, must(lambda v: v >= 1, "be >= 1"))
    fidelity_batches: int = option(4, must(lambda v: v >= 0, "be >= 0"))
    memory_budget_mb: int = option(4096, must(lambda v: v >= 1, "be >= 1"))
    histogram_sample: int = option(65536, must(lambda v: v >= 0, "be >= 0"))
    histogram_budget: int = option(2**24, must(lambda v: v >= 0, "be >= 0"))
    preprocess: str | None = option(None, also=(dict,), parse=preprocess_spec)
    progress: bool = option(True)
    save_calibration: str | None = option(None, also=(os.PathLike,), parse=_path)
    load_calibration: str | None = option(None, also=(os.PathLike,), parse=_path)


__all__ = ["CalibrationOptions"]
