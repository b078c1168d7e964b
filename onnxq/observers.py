"""Observers: streaming statistics of a tensor and the range methods that read them.

One :class:`TensorStats` per observed tensor holds the exact min/max and one histogram; every
histogram method (percentile, entropy, mse) reads that same histogram, so all of them are
available from a single pass over the calibration data.

The histogram is signed, over ``[-R, R]`` with :data:`BINS` bins, where ``R`` is always a power of
two (at least the largest magnitude seen).  When a batch exceeds ``R``, ``R`` doubles and pairs of
bins merge, which is exact.  Because ``R`` depends only on the largest magnitude seen, never on
the order or size of batches, the same samples give the same histogram however they are batched,
and merging two shards' statistics equals observing all the data (``merge``).

Range methods are registered by name in :data:`METHODS`; :func:`get_method` names the valid ones
when given an unknown name.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from onnxq.errors import CalibrationDataError, ConfigError, InternalError
from onnxq.exact import exact, exact_sum, rounded
from onnxq.precisions import QTYPES, QType

BINS = 4096  # signed bins over [-R, R]; 2048 per side, as TensorRT's entropy calibrator uses
_MIN_RANGE = 2.0**-24
POSITION_STEPS = 8  # position-peak bins per octave
POSITION_BINS = 2048  # 2^-128 .. 2^128; an all-zero position lands in bin 0
_TINY = 1e-12


_local = threading.local()


def _load_native() -> Any:
    """The compiled histogram update (``onnxq/_histogram.c``), or None: not built (no C
    compiler at install time) or switched off with ``ONNXQ_NO_NATIVE=1``.  Both paths give
    identical counts."""
    if os.environ.get("ONNXQ_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from onnxq import _histogram  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _histogram


_native: Any = _load_native()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-thread float32 and intp work buffers of at least ``n`` elements."""
    have = getattr(_local, "size", 0)
    if have < n:
        _local.size = n
        _local.flat = np.empty(n, dtype=np.float32)
        _local.idx = np.empty(n, dtype=np.intp)  # bincount's own index type: no conversion
    return _local.flat[:n], _local.idx[:n]


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
    # the sums of the per-sample minima and maxima, exact (:mod:`onnxq.exact`): the same for
    # any batching, and shards of data merge into the same value
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
        peak = x.max(axis=1) if self.nonnegative else np.maximum(x.max(axis=1), -x.min(axis=1))
        with np.errstate(divide="ignore"):  # a silent position: log2(0) = -inf, bin 0
            scaled = np.floor(np.log2(peak.astype(np.float64)) * POSITION_STEPS)
        index = np.clip(scaled + POSITION_BINS // 2, 0, POSITION_BINS - 1).astype(np.intp)
        counts = np.bincount(index.reshape(-1), minlength=POSITION_BINS)
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
        total = int(self.position_counts.sum())
        top = max(abs(self.min), abs(self.max))
        if total == 0 or not top > 0:
            return None
        bound = math.floor(math.log2(top * below) * POSITION_STEPS) + POSITION_BINS // 2
        return int(self.position_counts[1 : max(1, min(bound, POSITION_BINS))].sum()), total

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
        """Count values (an array, possibly a strided view) into the histogram; they must
        lie within the current range (and be >= 0 when ``nonnegative``).  The numpy path:
        :meth:`update` uses the compiled ``onnxq._histogram.count`` instead where it is built,
        which gives the same counts."""
        # floor(x * 2^k) is exact while the product cannot underflow, so a value's bin at
        # range 2R is exactly its bin at range R halved: re-binning and batching never move it.
        scale = BINS / (2.0 * self.range)
        flat, idx = _scratch(values.size)  # reused buffers: fresh allocations page-fault
        idx = idx.reshape(values.shape)
        half = BINS // 2
        if nonnegative:
            # x * 2^k >= 0 is exact in float32 (an underflow lands below 1, in bin 0 either
            # way), and for values >= 0 the int conversion's truncation is the floor: one pass
            np.multiply(values, np.float32(scale), out=idx, casting="unsafe")
            self.counts[half:] += np.bincount(idx.reshape(-1), minlength=half)
            return
        # 2^k = BINS / 2R is >= 1 up to R = 2048: float32 is exact there.  Above, a tiny
        # negative x could underflow to -0 and land in the bin above zero: float64 is exact for
        # every float32 x and power of two.  R is strictly above every |x|, so no index needs
        # clipping; adding BINS/2 to an integer-valued float below 2^24 is exact too.
        if scale < 1.0:
            flat = np.empty(values.size, dtype=np.float64)
        flat = flat.reshape(values.shape)
        np.multiply(values, flat.dtype.type(scale), out=flat)
        np.floor(flat, out=flat)
        np.add(flat, flat.dtype.type(half), out=flat)
        np.copyto(idx, flat, casting="unsafe")
        self.counts += np.bincount(idx.reshape(-1), minlength=BINS)

    def _grow(self, amax: float) -> None:
        # the smallest power of two strictly above amax: no value ever sits on the top edge,
        # so no value is clipped into a bin it would not have at a larger range
        target = (
            max(_MIN_RANGE, 2.0 ** (math.floor(math.log2(amax)) + 1)) if amax > 0 else _MIN_RANGE
        )
        self._widen(target)

    def _widen(self, target: float) -> None:
        """Double the range (merging bin pairs, exactly) until it reaches ``target``."""
        if self.range == 0.0:
            self.range = target
            return
        while self.range < target:
            merged = self.counts.reshape(-1, 2).sum(axis=1)
            self.counts = np.zeros(BINS, dtype=np.int64)
            self.counts[BINS // 4 : BINS // 4 + BINS // 2] = merged
            self.range *= 2.0

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


# --------------------------------------------------------------------------- range methods
@dataclass(frozen=True)
class MethodOptions:
    """Knobs of the range methods."""

    percentile: float = 99.99
    num_quant_levels: int = 128  # magnitudes representable on one side (int8: 128)
    # robust_minmax: max |x| over the percentile's |x| from which a few outliers, not the bulk,
    # set the range
    outlier_ratio: float = 2.5


RangeFn = Callable[[TensorStats, bool, MethodOptions], tuple[float, float]]


def _minmax(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    return stats.min, stats.max


def _percentile(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    p = opts.percentile / 100.0
    if symmetric:
        hist, width = stats.abs_histogram()
        amax = _quantile_edge(hist, width, 0.0, p)
        amax = min(amax, max(abs(stats.min), abs(stats.max)))
        return -amax, amax
    width = 2.0 * stats.range / BINS
    lo = _quantile_edge(stats.counts, width, -stats.range, (1.0 - p) / 2.0, upper=False)
    hi = _quantile_edge(stats.counts, width, -stats.range, 1.0 - (1.0 - p) / 2.0)
    return max(lo, stats.min), min(hi, stats.max)


def _robust_minmax(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    """``minmax``, unless a few outliers dominate the range: when max |x| passes
    ``opts.outlier_ratio`` times the ``percentile`` of |x|, the ``percentile`` range.

    For raw op outputs that the next op reads whole (onnxruntime's requantized conv outputs):
    ``minmax`` keeps the moderate tails such outputs carry (PP-OCR's, mobilenet's: at most
    2.0x), while one conv output of magika over [-174, 172] or ISNet's (up to 27x) would
    otherwise set a step that erases the rest."""
    method = _percentile if robust_choice(stats, opts) == "percentile" else _minmax
    return method(stats, symmetric, opts)


def robust_choice(stats: TensorStats, opts: MethodOptions) -> str:
    """What ``robust_minmax`` takes for these statistics: ``minmax`` or ``percentile``."""
    hist, width = stats.abs_histogram()
    amax = max(abs(stats.min), abs(stats.max))
    bulk = min(_quantile_edge(hist, width, 0.0, opts.percentile / 100.0), amax)
    return "percentile" if bulk > 0 and amax > opts.outlier_ratio * bulk else "minmax"


def _quantile_edge(
    hist: np.ndarray, width: float, start: float, q: float, upper: bool = True
) -> float:
    total = hist.sum()
    if total == 0:
        return 0.0
    cdf = np.cumsum(hist)
    i = int(np.searchsorted(cdf, q * total, side="left"))
    i = min(i, len(hist) - 1)
    return start + (i + 1) * width if upper else start + i * width


def _entropy(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    """TensorRT's calibrator: the |x| threshold whose quantized distribution has least KL."""
    hist, width = stats.abs_histogram()
    nz = np.nonzero(hist)[0]
    if nz.size == 0:
        return 0.0, 0.0
    last = int(nz[-1]) + 1
    levels = opts.num_quant_levels
    if last <= levels:
        amax = last * width
    else:
        kept = hist[:last].astype(np.float64)
        # the first bin holds the exact zeros of ReLU/padding, which every scale represents
        # exactly; left in, that spike dominates the KL and pulls the threshold far too low
        # (TensorRT's pytorch-quantization and ModelOpt replace it by its neighbour the same way)
        kept[0] = kept[1]
        amax = _kl_threshold(kept, levels) * width
    amax = min(amax, max(abs(stats.min), abs(stats.max)))
    if symmetric:
        return -amax, amax
    return max(stats.min, -amax), min(stats.max, amax)


def _kl_threshold(hist: np.ndarray, levels: int) -> int:
    """Number of |x| bins to keep: TensorRT's entropy calibration (as onnxruntime implements
    it: outliers clipped into the last kept bin, empty bins smoothed), over a stride of
    candidate thresholds."""
    n = len(hist)
    step = max(1, (n - levels) // 256)
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0]])
    best_i, best_kl = n, math.inf
    for i in range(levels, n + 1, step):
        p = hist[:i].astype(np.float64)
        p[-1] += tail[i]
        merged = i // levels
        groups = np.add.reduceat(hist[:i].astype(np.float64), np.arange(0, levels) * merged)
        nonzero = (p != 0).astype(np.float64)
        norm = np.add.reduceat(nonzero, np.arange(0, levels) * merged)
        sizes = np.full(levels, merged)
        sizes[-1] = i - merged * (levels - 1)
        avg = np.divide(groups, norm, out=np.zeros(levels), where=norm > 0)
        q = np.repeat(avg, sizes) * nonzero
        kl = _kl(_smooth(p), _smooth(q))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Move a little mass to empty bins so that KL stays finite (onnxruntime's smoothing)."""
    zero = p == 0
    n_zero, n_nonzero = int(zero.sum()), int(p.size - zero.sum())
    if n_nonzero == 0:
        return p
    out = p / p.sum()
    if n_zero:
        out = out + eps * zero - (eps * n_zero / n_nonzero) * (~zero)
    return out


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    mask = p > 0
    if np.any(q[mask] <= 0):
        return math.inf
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def _mse(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    """The |x| clip value minimising expected squared error (rounding inside, clipping out)."""
    hist, width = stats.abs_histogram()
    nz = np.nonzero(hist)[0]
    if nz.size == 0:
        return 0.0, 0.0
    last = int(nz[-1]) + 1
    centers = (np.arange(last) + 0.5) * width
    counts = hist[:last].astype(np.float64)
    candidates = np.unique(np.linspace(max(1, last // 32), last, 128).astype(np.int64)) * width
    amax = max(abs(stats.min), abs(stats.max))
    candidates = np.minimum(candidates, amax)
    step = candidates / (opts.num_quant_levels - 1)
    clipped = np.maximum(centers[None, :] - candidates[:, None], 0.0)
    inside = centers[None, :] <= candidates[:, None]
    err = np.where(inside, (step[:, None] ** 2) / 12.0, clipped**2) @ counts
    best = float(candidates[int(np.argmin(err))])
    if symmetric:
        return -best, best
    return max(stats.min, -best), min(stats.max, best)


def _ema(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    """Moving-average min/max: the mean of the per-sample minima and maxima.

    Sparsebit-style moving averages weight batches by arrival order; averaging per sample
    (the leading axis) instead gives the same result for any batching and order, and merges
    exactly.
    """
    if stats.samples == 0:
        return stats.min, stats.max
    return stats.sample_min_sum / stats.samples, stats.sample_max_sum / stats.samples


# ACIQ (Banner et al., 2019): optimal clip for 8-bit, in units of the Laplace scale b / the
# Gaussian sigma.
_ACIQ_LAPLACE_8BIT = 9.89
_ACIQ_GAUSS_8BIT = 3.92


def _aciq(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    """Analytic clipping: fit a Laplace or a Gaussian (by kurtosis) and clip at its optimum."""
    width = 2.0 * stats.range / BINS
    centers = -stats.range + (np.arange(BINS) + 0.5) * width
    w = stats.counts.astype(np.float64)
    total = w.sum()
    if total == 0:
        return stats.min, stats.max
    mean = float(w @ centers / total)
    dev = centers - mean
    var = float(w @ dev**2 / total)
    if var <= 0:
        return stats.min, stats.max
    kurtosis = float(w @ dev**4 / total) / var**2 - 3.0
    if kurtosis > 1.5:  # heavy tails: Laplace, b = mean absolute deviation
        alpha = _ACIQ_LAPLACE_8BIT * float(w @ np.abs(dev) / total)
    else:
        alpha = _ACIQ_GAUSS_8BIT * math.sqrt(var)
    if symmetric:
        amax = min(abs(mean) + alpha, max(abs(stats.min), abs(stats.max)))
        return -amax, amax
    return max(stats.min, mean - alpha), min(stats.max, mean + alpha)


def quantization_error(stats: TensorStats, lo: float, hi: float, levels: int) -> float:
    """Expected squared error per value when ``[lo, hi]`` is cut into ``levels`` steps.

    Read from the signed histogram: values inside round with error step^2/12, values outside
    clip to the nearest end.
    """
    width = 2.0 * stats.range / BINS
    centers = -stats.range + (np.arange(BINS) + 0.5) * width
    counts = stats.counts.astype(np.float64)
    total = counts.sum()
    if total == 0 or hi <= lo:
        return math.inf
    step = (hi - lo) / levels
    clipped = np.where(centers < lo, lo - centers, np.where(centers > hi, centers - hi, 0.0))
    inside = clipped == 0
    err = np.where(inside, step * step / 12.0, clipped * clipped)
    return float(err @ counts / total)


def _auto(stats: TensorStats, symmetric: bool, opts: MethodOptions) -> tuple[float, float]:
    return auto_choice(stats, symmetric, opts)[1]


def auto_choice(
    stats: TensorStats, symmetric: bool, opts: MethodOptions
) -> tuple[str, tuple[float, float]]:
    """The method (of the others) whose range has the least :func:`quantization_error`."""
    levels = 2 * opts.num_quant_levels - (2 if symmetric else 1)  # int8: 254 / 255
    best: tuple[float, str, tuple[float, float]] | None = None
    for name in AUTO_CANDIDATES:
        lo, hi = METHODS[name](stats, symmetric, opts)
        if symmetric:
            amax = max(abs(lo), abs(hi))
            lo, hi = -amax, amax
        else:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        err = quantization_error(stats, lo, hi, levels)
        if best is None or err < best[0]:
            best = (err, name, (lo, hi))
    assert best is not None
    return best[1], best[2]


METHODS: dict[str, RangeFn] = {
    "minmax": _minmax,
    "percentile": _percentile,
    "entropy": _entropy,
    "mse": _mse,
    "ema": _ema,
    "aciq": _aciq,
    "auto": _auto,
    "robust_minmax": _robust_minmax,
}
AUTO_CANDIDATES = ("minmax", "percentile", "entropy", "mse", "aciq", "ema")
HISTOGRAM_METHODS = frozenset({"percentile", "entropy", "mse", "aciq", "auto", "robust_minmax"})


def get_method(name: str) -> RangeFn:
    """The range method registered as ``name``."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(
            f"unknown calibration method {name!r}; valid: {', '.join(sorted(METHODS))}"
        ) from None


# --------------------------------------------------------------------------- qparams
@dataclass(frozen=True)
class QParams:
    """Scale and zero point of one tensor (scalars, or 1-D along ``axis`` for weights)."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None
    method: str = ""
    low: float = 0.0
    high: float = 0.0
    note: str = ""
    bound: str = ""  # where the range was clipped to its readers' saturation bounds


def activation_qparams(
    stats: TensorStats,
    method: str,
    dtype: str,
    symmetric: bool,
    opts: MethodOptions | None = None,
    bits: int | None = None,
    bounds: tuple[float, float] | None = None,
) -> QParams:
    """Per-tensor qparams of an activation from its statistics.

    ``dtype``: the element type (:data:`onnxq.precisions.QTYPES`); ``bits`` narrows an integer
    type (None: its full width).  A float type (FP8) takes its range from the tensor's amax
    under ``auto``: the expected-error comparison behind ``auto`` assumes uniform steps, and
    FP8's relative precision keeps small values where a clipped range would cut large ones.
    ``bounds``: (low, high) beyond which the tensor's readers saturate
    (:meth:`onnxq.place.facts.GraphFacts.saturation_bounds`); the method then sees the values
    clipped to them, and the range never passes them."""
    qtype = QTYPES[dtype]
    bits = qtype.bits if bits is None else bits
    opts = replace(opts or MethodOptions(), num_quant_levels=2 ** (bits - 1))
    seen = stats if bounds is None else stats.clamped(*bounds)
    if method == "auto" and qtype.is_float:
        method = "minmax"
    if method == "auto":
        method, (lo, hi) = auto_choice(seen, symmetric, opts)
        method = f"auto:{method}"
    else:
        lo, hi = get_method(method)(seen, symmetric, opts)
        if method == "robust_minmax":
            method = f"robust_minmax:{robust_choice(seen, opts)}"
    bound = ""
    if seen is not stats and bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
        bound = (
            f"observed [{stats.min:.6g}, {stats.max:.6g}] clipped to "
            f"[{max(stats.min, bounds[0]):.6g}, {min(stats.max, bounds[1]):.6g}]: "
            "every reader saturates beyond"
        )
    qp = range_to_qparams(lo, hi, dtype, symmetric, method, bits)
    if bound and not symmetric and bounds is not None:
        # a zero point rounds the grid's ends by up to half a step: a bound the range stops
        # at must stay on the grid, or every saturated value lands just inside it (a
        # hardswish of -2.9 instead of -3: -0.1 where the float model gives 0)
        qmin = 0 if not qtype.signed else -(2 ** (bits - 1))
        at_lo, at_hi = lo == bounds[0], hi == bounds[1]  # the range stops at a bound
        for _ in range(4):
            step, zp = float(qp.scale), int(qp.zero_point)
            short_lo = at_lo and (qmin - zp) * step > bounds[0]
            short_hi = at_hi and (qmin + 2**bits - 1 - zp) * step < bounds[1]
            if not (short_lo or short_hi):
                break
            lo, hi = lo - step / 2 * short_lo, hi + step / 2 * short_hi
            qp = range_to_qparams(lo, hi, dtype, symmetric, method, bits)
    return replace(qp, bound=bound)


def range_to_qparams(
    lo: float, hi: float, dtype: str, symmetric: bool, method: str = "", bits: int | None = None
) -> QParams:
    """Scale and zero point that cover ``[lo, hi]`` (always including 0) with ``bits`` bits
    inside the storage of ``dtype`` (None: all of them).  A float type (FP8 E4M3) is symmetric:
    scale = amax / its largest value (448), zero point 0."""
    qtype = QTYPES[dtype]
    bits = qtype.bits if bits is None else bits
    note = ""
    if symmetric or qtype.is_float:
        amax = max(abs(lo), abs(hi))
        if amax < _TINY:
            amax, note = 1.0, "constant zero on the calibration data: scale set to 1/qmax"
        qmax = qtype.qmax if qtype.is_float else float(2 ** (bits - 1) - 1)
        scale = np.float32(amax / qmax)
        zp = qtype.zeros()
        if not qtype.signed:  # symmetric unsigned is centred on 128 (32768 for 16 bits)
            zp = np.array(2 ** (qtype.bits - 1), dtype=qtype.numpy_dtype)
        return QParams(np.asarray(scale, np.float32), zp, None, method, -amax, amax, note)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < _TINY:
        lo, hi, note = -1.0, 1.0, "constant zero on the calibration data: range set to [-1, 1]"
    levels = 2**bits - 1
    qmin = 0 if not qtype.signed else -(2 ** (bits - 1))
    qmax = qmin + levels
    scale = np.float32((hi - lo) / (qmax - qmin))
    zp_value = int(np.clip(round(qmin - lo / float(scale)), qmin, qmax))
    zp_arr = np.array(zp_value, dtype=qtype.numpy_dtype)
    return QParams(np.asarray(scale, np.float32), zp_arr, None, method, lo, hi, note)


WEIGHT_METHODS = ("minmax", "mse")
_WEIGHT_CLIP_RATIOS = np.linspace(0.5, 1.0, 26, dtype=np.float32)


def weight_qparams(
    weight: np.ndarray,
    axis: int | None,
    qmax: float = 127,
    method: str = "minmax",
    dtype: str = "int8",
) -> QParams:
    """Symmetric qparams of a weight, per channel along ``axis`` (or per tensor).

    ``minmax`` covers each channel's largest magnitude; ``mse`` shrinks each channel's range
    (down to half) where that lowers the channel's squared rounding + clipping error (integer
    types; a float type, FP8, always takes the amax: scale = amax / 448, as TensorRT's FP8
    recipe does).
    """
    qtype = QTYPES[dtype]
    if qtype.is_float:
        method, qmax = "minmax", qtype.qmax
    w = np.asarray(weight, dtype=np.float32)
    moved = w.reshape(1, -1) if axis is None else np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(moved).max(axis=1) if moved.size else np.zeros(len(moved), np.float32)
    amax = np.where(amax > _TINY, amax, np.float32(1.0)).astype(np.float32)
    if method == "mse" and moved.size:
        amax = _mse_weight_range(moved, amax, qmax)
    elif method not in WEIGHT_METHODS:
        raise ConfigError(f"unknown weight method {method!r}; valid: {', '.join(WEIGHT_METHODS)}")
    scale = (amax / np.float32(qmax)).astype(np.float32)
    if axis is None:
        scale = scale.reshape(())
    return QParams(
        scale, qtype.zeros(scale.shape), axis, method, -float(amax.max()), float(amax.max())
    )


def _mse_weight_range(
    rows: np.ndarray, amax: np.ndarray, qmax: float, block: int = 1 << 16
) -> np.ndarray:
    """Per row, the clip among ``_WEIGHT_CLIP_RATIOS * amax`` with the least squared error.

    Rows are processed in blocks of about ``block`` values through one reused buffer: the
    arithmetic per row is unchanged, the working set stays in cache (3-4x faster on
    4096x4096 weights than whole-tensor temporaries).
    """
    n, k = rows.shape
    best = amax.astype(np.float32, copy=True)
    per = max(1, block // max(k, 1))
    buf = np.empty((min(per, n), k), dtype=np.float32)
    for start in range(0, n, per):
        r = rows[start : start + per]
        a = amax[start : start + per]
        b = buf[: len(r)]
        out = best[start : start + per]
        best_err = np.full(len(r), np.inf)
        for ratio in _WEIGHT_CLIP_RATIOS:
            cand = a * ratio
            scale = (cand / np.float32(qmax))[:, None]
            np.divide(r, scale, out=b)
            np.rint(b, out=b)
            np.clip(b, -qmax, qmax, out=b)
            b *= scale
            b -= r
            np.square(b, out=b)
            err = b.sum(axis=1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            out[...] = np.where(better, cand, out)
    return best


def quantize_weight(weight: np.ndarray, qp: QParams, qmax: float = 127) -> np.ndarray:
    """Values of ``weight`` under ``qp`` in the zero point's type (int8; FP8 E4M3), rounded
    half to even and saturated as QuantizeLinear does; integers within ``+-qmax``."""
    w = np.asarray(weight, dtype=np.float32)
    scaled = w / _broadcast_scale(qp, w.ndim)
    qtype = qtype_of_array(np.asarray(qp.zero_point))
    if qtype.is_float:
        return qtype.cast(scaled)
    return np.clip(np.rint(scaled), -qmax, qmax).astype(qtype.numpy_dtype)


def qtype_of_array(values: np.ndarray) -> QType:
    """The :class:`~onnxq.precisions.QType` of an array's numpy type (int8, float8e4m3fn...)."""
    for qtype in QTYPES.values():
        if qtype.numpy_dtype == values.dtype:
            return qtype
    raise InternalError(f"no Q/DQ element type holds numpy {values.dtype}")


def dequantize_weight(q: np.ndarray, qp: QParams) -> np.ndarray:
    """The float32 values DequantizeLinear gives for the quantized ``q`` under ``qp``."""
    return (q.astype(np.float32) * _broadcast_scale(qp, q.ndim)).astype(np.float32)


def _broadcast_scale(qp: QParams, ndim: int) -> np.ndarray:
    """``qp.scale`` shaped to broadcast against a tensor of rank ``ndim``."""
    if qp.axis is None:
        return qp.scale
    shape = [1] * ndim
    shape[qp.axis] = -1
    return qp.scale.reshape(shape)
