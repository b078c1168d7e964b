"""Per-position peaks of an ``[N, C, T]`` tensor: each position (sample, t) counted by its peak
|x| over the channels, in :data:`POSITION_BINS` log-spaced bins, and the share of positions
that a tensor-wide int8 scale would leave with few levels."""

from __future__ import annotations

import math

import numpy as np

POSITION_STEPS = 8  # position-peak bins per octave
POSITION_BINS = 2048  # 2^-128 .. 2^128; an all-zero position lands in bin 0


def count_positions(x: np.ndarray, nonnegative: bool) -> np.ndarray:
    """The bin counts of the positions of ``x`` (``[N, C, T]``) by their peak |x| over the
    channels (``nonnegative``: every value is >= 0, the maxima are the peaks)."""
    peak = x.max(axis=1) if nonnegative else np.maximum(x.max(axis=1), -x.min(axis=1))
    with np.errstate(divide="ignore"):  # a silent position: log2(0) = -inf, bin 0
        scaled = np.floor(np.log2(peak.astype(np.float64)) * POSITION_STEPS)
    index = np.clip(scaled + POSITION_BINS // 2, 0, POSITION_BINS - 1).astype(np.intp)
    return np.bincount(index.reshape(-1), minlength=POSITION_BINS)


def weak_share(counts: np.ndarray, top: float, below: float) -> tuple[int, int] | None:
    """(positions whose peak is above 0 and under ``below`` x ``top``, the tensor's peak;
    positions), or None when nothing was counted or the tensor is all zero.  An all-zero
    position (padding) is not weak: int8 holds it exactly.  A position in the bin that
    straddles the bound counts as not weak (the bins are 1/8 octave wide)."""
    total = int(counts.sum())
    if total == 0 or not top > 0:
        return None
    bound = math.floor(math.log2(top * below) * POSITION_STEPS) + POSITION_BINS // 2
    return int(counts[1 : max(1, min(bound, POSITION_BINS))].sum()), total
