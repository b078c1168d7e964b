"""From statistics to activation qparams: each annotated activation's range, by its method,
in its element type (its precision's, signed or unsigned as the backend's activations),
clipped where its readers saturate.  A dynamic profile has none: its kernels quantize
activations at run time.  What needs saying (a tensor that saw no float value, an
observer's note) comes back as data for the report's messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onnxq.backends.profile import BackendProfile
from onnxq.numerics.observers import MethodOptions
from onnxq.numerics.precisions import tensor_qtype
from onnxq.numerics.qparams import QParams, activation_qparams
from onnxq.numerics.tensor_stats import TensorStats
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
    ``stats`` and saw at least one value; none for a dynamic profile)."""
    opts = MethodOptions(percentile=percentile)
    qparams: dict[str, QParams] = {}
    remarks: list[RangeRemark] = []
    if profile.dynamic:
        return ActivationRanges(qparams, ())
    for ann in annotations.of_kind("activation"):
        seen = stats[ann.tensor]
        if seen.count == 0:
            remarks.append(RangeRemark(ann.tensor, None))
            continue
        symmetric = ann.settings.symmetric
        qp = activation_qparams(
            seen,
            ann.method,
            tensor_qtype("activation", ann.settings.precision, profile.activation_dtype).name,
            profile.activation_symmetric if symmetric is None else symmetric,
            opts,
            ann.settings.bits,
            ann.bounds,
        )
        if qp.note:
            remarks.append(RangeRemark(ann.tensor, qp.note))
        qparams[ann.tensor] = qp
    return ActivationRanges(qparams, tuple(remarks))
