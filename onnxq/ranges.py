"""From statistics to activation qparams: each annotated activation's range, by its method,
clipped where its readers saturate.  What needs saying (a tensor that saw no float value, an
observer's note) comes back as data for the report's messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onnxq.backends.profile import BackendProfile
from onnxq.observers import MethodOptions, QParams, TensorStats, activation_qparams
from onnxq.place.annotations import Annotations


@dataclass(frozen=True)
class RangeRemark:
    """Something about one tensor's range: ``note`` is the observer's note, or None when the
    tensor produced no float value during calibration (it then stays float)."""

    tensor: str
    note: str | None


@dataclass(frozen=True)
class ActivationRanges:
    """The qparams of every activation that has a range, and the remarks, in graph order."""

    qparams: dict[str, QParams]
    remarks: tuple[RangeRemark, ...]


def activation_ranges(
    annotations: Annotations,
    stats: Mapping[str, TensorStats],
    profile: BackendProfile,
    percentile: float,
) -> ActivationRanges:
    """Qparams of the annotated activations from their statistics (one per tensor that is in
    ``stats`` and saw at least one value)."""
    opts = MethodOptions(percentile=percentile)
    qparams: dict[str, QParams] = {}
    remarks: list[RangeRemark] = []
    for ann in annotations.of_kind("activation"):
        seen = stats[ann.tensor]
        if seen.count == 0:
            remarks.append(RangeRemark(ann.tensor, None))
            continue
        symmetric = ann.settings.symmetric
        qp = activation_qparams(
            seen,
            ann.method,
            profile.activation_dtype,
            profile.activation_symmetric if symmetric is None else symmetric,
            opts,
            ann.settings.bits,
            ann.bounds,
        )
        if qp.note:
            remarks.append(RangeRemark(ann.tensor, qp.note))
        qparams[ann.tensor] = qp
    return ActivationRanges(qparams, tuple(remarks))
