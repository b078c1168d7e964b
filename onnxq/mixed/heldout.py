"""The batches an accuracy target is measured on (``onnxq.mixed.search``): an explicit
source, or the first batches of the calibration data, which calibration then skips."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import batches_total, check_batch, open_source
from onnxq.errors import CalibrationDataError


@dataclass(frozen=True)
class HeldOut:
    """The batches the target is measured on, and where they came from (for the report)."""

    batches: list[Batch]
    source: str


class _Skipping:
    """A re-iterable source without its first ``count`` batches (they are held out)."""

    def __init__(self, source: Iterable[Batch], count: int) -> None:
        self._source, self._count = source, count

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self._source), self._count, None)

    def __len__(self) -> int:
        return max(0, len(self._source) - self._count)  # type: ignore[arg-type]


def hold_out(
    data: Iterable[Batch] | None,
    heldout: Any,
    inputs: list[InputSpec],
    count: int,
    batch_size: int = 1,
    preprocess: str | None = None,
) -> tuple[HeldOut, Iterable[Batch] | None]:
    """The held-out batches and the calibration data left: up to ``count`` batches of an
    explicit ``heldout`` source (calibration keeps all of ``data``), else the first
    ``count`` batches of ``data`` (at most a quarter of a source that knows its length),
    which calibration then skips."""
    if heldout is not None:
        source = open_source(heldout, inputs, batch_size, preprocess)
        batches = [check_batch(b, inputs, i) for i, b in enumerate(itertools.islice(source, count))]
        if not batches:
            raise CalibrationDataError("the held-out data for the accuracy target is empty")
        return HeldOut(batches, f"{len(batches)} batches of the held-out data"), data
    if data is None:
        raise CalibrationDataError(
            "an accuracy target needs data to measure it on: pass --calib DATA or --heldout DATA"
        )
    total = batches_total(data)
    take = count if total is None else min(count, total // 4)
    if take < 1:
        raise CalibrationDataError(
            f"{total} calibration batch(es) are too few to hold some out for the accuracy "
            "target (it holds out a quarter, at most heldout_batches); give more batches, or "
            "held-out data (--heldout DATA)"
        )
    reiterable = iter(data) is not data
    stream = iter(data)
    batches = [check_batch(b, inputs, i) for i, b in enumerate(itertools.islice(stream, take))]
    rest: Iterable[Batch] = _Skipping(data, take) if reiterable else stream
    where = f"the first {len(batches)} calibration batches, which calibration skips"
    return HeldOut(batches, where), rest


__all__ = ["HeldOut", "hold_out"]
