"""Streaming statistics of one tensor: exact min/max, one histogram, per-channel and
per-position peaks.

The histogram is signed, over ``[-R, R]`` with :data:`BINS` bins, where ``R`` is always a power of
two (at least the largest magnitude seen).  When a batch exceeds ``R``, ``R`` doubles and pairs of
bins merge, which is exact.  Because ``R`` depends only on the largest magnitude seen, never on
the order or size of batches, the same samples give the same histogram however they are batched,
and merging two shards' statistics equals observing all the data (``merge``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from onnxq.errors import CalibrationDataError
from onnxq.numerics.exact import exact, exact_sum, rounded
from onnxq.numerics.histogram_bins import BINS, count_values, load_native, range_above, widened
from onnxq.numerics.position_peaks import POSITION_BINS, count_positions, weak_share

# the histogram's binning: onnxq.numerics.histogram_bins; the positions': position_peaks
_native: Any = load_native()  # the compiled histogram update, or None


@dataclass
class TensorStats:
    """Streaming min/max and histogram of one tensor (see the module docstring)."""

    name: str
    histogram: bool = True
    count: int = 0
    min: float = math.inf
    max: float = -math.inf
    range: float = 0.0  # R, a power of two, 0 until the first non-empty update
    counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS, dtype=np.int64))
    samples: int = 0  # samples along the leading axis, for the moving-average min/max
    # the sums of the per-sample minima and maxima, exact (:mod:`onnxq.numerics.exact`): the same
    # for any batching, and shards of data merge into the same value
    sample_min_total: int = 0
    sample_max_total: int = 0
    channels: bool = False  # also track each channel's peak |x| (axis 1)
    channel_amax: np.ndarray | None = None
    # also count the positions (sample, t) of a rank-3 [N, C, T] tensor by their peak |x| over
    # the channels, in POSITION_BINS log-spaced bins (:meth:`weak_positions`)
    positions: bool = False
    position_counts: np.ndarray | None = None
    # the graph guarantees x >= 0 (a Relu's output, ...): only maxima are read and the minimum
    # is recorded as 0.  Every range includes 0, so no scale depends on a minimum above 0.
    nonnegative: bool = False

    def update(self, x: np.ndarray, where: str = "", stride: int = 1, batch_axis: int = 0) -> None:
        """Add one batch of values of this tensor.

        Min and max see every value; the histogram gets every ``stride``-th value of each
        sample (each item along ``batch_axis``, the leading axis unless the tensor is
        time-major; rank <= 1: the whole batch is one sample), so the same samples give the
        same histogram however they are batched.
        """
        if x.size == 0:
            return
        x = np.asarray(x)
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        if batch_axis and x.ndim > batch_axis:
            x = np.ascontiguousarray(np.moveaxis(x, batch_axis, 0))
        rows = x.reshape(x.shape[0], -1) if x.ndim >= 2 else x.reshape(1, -1)
        row_max, row_min, peak = self._extremes(x, rows)
        lo, _ = self._record(row_min, row_max, peak, int(x.size), where)
        if self.positions:
            self._count_positions(x)
        if self.histogram:
            if (
                _native is not None
                and rows.flags.c_contiguous
                and rows.dtype == np.float32
                and self.counts.dtype == np.int64
                and self.counts.flags.c_contiguous
            ):
                _native.count(
                    rows, rows.shape[0], stride, BINS / (2.0 * self.range), BINS // 2, self.counts
                )
            else:
                self._add_values(rows[:, ::stride] if stride > 1 else rows, lo >= 0.0)

    def update_peaks(
        self,
        row_max: np.ndarray,
        count: int,
        where: str = "",
        channel_max: np.ndarray | None = None,
    ) -> None:
        """Add one batch of a non-negative tensor seen through its maxima: ``row_max`` per
        sample, ``channel_max`` per sample and channel (needed when :attr:`channels`), and its
        value count.  Every value was >= 0 (:attr:`nonnegative`), so the minimum is 0; there
        is no histogram to fill."""
        if row_max.size == 0:
            return
        peak = None
        if self.channels and channel_max is not None:
            peak = channel_max.reshape(channel_max.shape[0], -1).max(axis=0).astype(np.float64)
        self._record(None, row_max, peak, count, where)

    def _record(
        self,
        row_min: np.ndarray | None,
        row_max: np.ndarray,
        peak: np.ndarray | None,
        count: int,
        where: str,
    ) -> tuple[float, float]:
        """Fold one batch's per-sample extremes in (and widen the histogram's range);
        ``row_min`` None: all zero."""
        lo = 0.0 if row_min is None else float(row_min.min())
        hi = float(row_max.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise CalibrationDataError(
                f"tensor {self.name!r} has NaN or Inf values{where}; check the calibration data "
                "(a NaN/Inf input or a model that overflows on it)"
            )
        self.count += count
        self.samples += len(row_max)
        if row_min is not None:
            self.sample_min_total += exact_sum(row_min)
        self.sample_max_total += exact_sum(row_max)
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        if peak is not None:
            self._merge_channels(peak)
        if self.histogram:
            self._grow(max(abs(lo), abs(hi)))
        return lo, hi

    def _extremes(
        self, x: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Per-sample maxima and minima (float64; no minima: all 0), and each channel's peak
        |x| when tracked.

        numpy's min/max propagate NaN, so a NaN shows in the maxima; a non-negative tensor
        skips the pass over its minima."""
        if self.channels and x.ndim >= 3:
            # per (sample, channel) first: the per-sample extremes come from these, so the
            # channel peaks cost no extra pass over the data
            per = x.reshape(x.shape[0], x.shape[1], -1)
            ch_max = per.max(axis=2)
            if self.nonnegative:
                row_max = ch_max.max(axis=1).astype(np.float64)
                return row_max, None, ch_max.max(axis=0).astype(np.float64)
            ch_min = per.min(axis=2)
            peak = np.maximum(np.abs(ch_min), np.abs(ch_max)).max(axis=0).astype(np.float64)
            return (
                ch_max.max(axis=1).astype(np.float64),
                ch_min.min(axis=1).astype(np.float64),
                peak,
            )
        row_max = rows.max(axis=1).astype(np.float64)
        if self.nonnegative:
            return row_max, None, None
        return row_max, rows.min(axis=1).astype(np.float64), None

    def _merge_channels(self, peak: np.ndarray) -> None:
        if self.channel_amax is None:
            self.channel_amax = peak
        elif self.channel_amax.shape == peak.shape:
            self.channel_amax = np.maximum(self.channel_amax, peak)
        else:  # a channel count that changes between batches: no per-channel view
            self.channels, self.channel_amax = False, None

    def _count_positions(self, x: np.ndarray) -> None:
        if x.ndim != 3:  # not an [N, C, T] tensor after all: no per-position view
            self.positions, self.position_counts = False, None
            return
        counts = count_positions(x, self.nonnegative)
        self.position_counts = (
            counts if self.position_counts is None else self.position_counts + counts
        )

    def weak_positions(self, below: float = 1 / 16) -> tuple[int, int] | None:
        """(positions whose peak |x| over the channels is above 0 and under ``below`` x the
        tensor's peak, positions), if they were counted.  An all-zero position (padding) is
        not weak: int8 holds it exactly.  A position in the bin that straddles the bound
        counts as not weak (the bins are 1/8 octave wide)."""
        if self.position_counts is None:
            return None
        return weak_share(self.position_counts, max(abs(self.min), abs(self.max)), below)

    def weak_channels(self, below: float = 1 / 16) -> tuple[int, int] | None:
        """(channels whose peak |x| is under ``below`` x the tensor's peak, channels), if the
        per-channel peaks were tracked."""
        if self.channel_amax is None or not self.channel_amax.size:
            return None
        top = float(self.channel_amax.max())
        if top <= 0:
            return None
        return int((self.channel_amax < below * top).sum()), int(self.channel_amax.size)

    def _add_values(self, values: np.ndarray, nonnegative: bool = False) -> None:
        """Count values into the histogram, the numpy path
        (:func:`onnxq.numerics.histogram_bins.count_values`)."""
        count_values(self.counts, self.range, values, nonnegative)

    def _grow(self, amax: float) -> None:
        self._widen(range_above(amax))

    def _widen(self, target: float) -> None:
        """Double the range (merging bin pairs, exactly) until it reaches ``target``."""
        self.counts, self.range = widened(self.counts, self.range, target)

    def merge(self, other: TensorStats) -> TensorStats:
        """Combine the statistics of two shards of data in place; returns ``self``."""
        if other.count == 0:
            return self
        if other.channel_amax is not None and (self.channel_amax is not None or not self.count):
            self._merge_channels(other.channel_amax.copy())
        elif self.count:  # one shard without channel peaks: no per-channel view of the whole
            self.channels, self.channel_amax = False, None
        if self.position_counts is not None and other.position_counts is not None:
            self.position_counts = self.position_counts + other.position_counts
        elif other.position_counts is not None and not self.count:
            self.positions, self.position_counts = True, other.position_counts.copy()
        elif self.count or other.count:  # one shard without them: no per-position view
            self.positions, self.position_counts = False, None
        self.nonnegative = self.nonnegative and other.nonnegative
        self.samples += other.samples
        self.sample_min_total += other.sample_min_total
        self.sample_max_total += other.sample_max_total
        if self.count == 0:
            self.count, self.min, self.max = other.count, other.min, other.max
            self.range, self.counts = other.range, other.counts.copy()
            return self
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if self.histogram and other.histogram:
            theirs = TensorStats(self.name, range=other.range, counts=other.counts.copy())
            target = max(self.range, other.range)
            self._widen(target)
            theirs._widen(target)
            self.counts = self.counts + theirs.counts
        return self

    def clamped(self, low: float, high: float) -> TensorStats:
        """These statistics with every value clipped to ``[low, high]`` (histogram counts
        beyond them moved into the bins of the bounds); ``self`` when nothing lies beyond."""
        if low <= self.min and self.max <= high:
            return self
        out = replace(
            self,
            counts=self.counts.copy(),
            min=min(max(self.min, low), high),
            max=max(min(self.max, high), low),
        )
        if self.histogram and self.range > 0:
            scale = BINS / (2.0 * self.range)
            if low > -self.range:
                b = min(BINS - 1, math.floor(low * scale) + BINS // 2)
                out.counts[b] += out.counts[:b].sum()
                out.counts[:b] = 0
            if high < self.range:
                b = max(0, math.floor(high * scale) + BINS // 2)
                out.counts[b] += out.counts[b + 1 :].sum()
                out.counts[b + 1 :] = 0
        return out

    @property
    def sample_min_sum(self) -> float:
        """The sum of the per-sample minima."""
        return rounded(self.sample_min_total)

    @property
    def sample_max_sum(self) -> float:
        """The sum of the per-sample maxima."""
        return rounded(self.sample_max_total)

    # -- views of the histogram -------------------------------------------------------------
    def abs_histogram(self) -> tuple[np.ndarray, float]:
        """Counts of |x| in BINS/2 bins over [0, R], and the bin width."""
        half = BINS // 2
        folded = self.counts[half:] + self.counts[:half][::-1]
        return folded, self.range / half

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (for calibration caches)."""
        nz = np.nonzero(self.counts)[0]
        return {
            "count": self.count,
            "min": self.min,
            "max": self.max,
            "range": self.range,
            "samples": self.samples,
            "sample_min_sum": self.sample_min_sum,
            "sample_max_sum": self.sample_max_sum,
            "histogram": self.histogram,
            "nonnegative": self.nonnegative,
            "bins": [int(i) for i in nz],
            "counts": [int(self.counts[i]) for i in nz],
            "channel_amax": (
                None if self.channel_amax is None else [float(v) for v in self.channel_amax]
            ),
            **(
                {}
                if self.position_counts is None
                else {
                    "position_bins": [int(i) for i in np.nonzero(self.position_counts)[0]],
                    "position_counts": [int(c) for c in self.position_counts if c],
                }
            ),
        }

    @classmethod
    def from_json(cls, name: str, data: dict) -> TensorStats:  # type: ignore[type-arg]
        """The inverse of :meth:`to_json`."""
        stats = cls(
            name,
            count=int(data["count"]),
            min=float(data["min"]),
            max=float(data["max"]),
            range=float(data["range"]),
            samples=int(data["samples"]),
            sample_min_total=exact(float(data["sample_min_sum"])),
            sample_max_total=exact(float(data["sample_max_sum"])),
            histogram=bool(data["histogram"]),
            nonnegative=bool(data.get("nonnegative", False)),
        )
        stats.counts[np.asarray(data["bins"], dtype=np.int64)] = np.asarray(
            data["counts"], dtype=np.int64
        )
        if data.get("channel_amax") is not None:
            stats.channels = True
            stats.channel_amax = np.asarray(data["channel_amax"], dtype=np.float64)
        if data.get("position_bins") is not None:
            stats.positions = True
            stats.position_counts = np.zeros(POSITION_BINS, dtype=np.int64)
            stats.position_counts[np.asarray(data["position_bins"], dtype=np.int64)] = np.asarray(
                data["position_counts"], dtype=np.int64
            )
        return stats
