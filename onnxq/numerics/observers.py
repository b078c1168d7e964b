"""Observers: the range methods that read a tensor's streaming statistics
(:class:`onnxq.numerics.tensor_stats.TensorStats`).

Every histogram method (percentile, entropy, mse, ...) reads the same histogram, so all of them
are available from a single pass over the calibration data.  Range methods are registered by
name in :data:`METHODS`; :func:`get_method` names the valid ones when given an unknown name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxq.errors import ConfigError
from onnxq.numerics.tensor_stats import BINS, TensorStats


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
