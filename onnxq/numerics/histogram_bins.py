"""The binning of :class:`~onnxq.numerics.tensor_stats.TensorStats`' histogram: :data:`BINS`
signed bins over ``[-R, R]``, ``R`` a power of two above every magnitude seen.  Counting a value
and doubling ``R`` (merging bin pairs) are exact, so the counts do not depend on how the data
was batched.  The compiled counter (``onnxq/numerics/_histogram.c``) does the same arithmetic
as :func:`count_values`."""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np

BINS = 4096  # signed bins over [-R, R]; 2048 per side, as TensorRT's entropy calibrator uses
MIN_RANGE = 2.0**-24

_local = threading.local()


def load_native() -> Any:
    """The compiled histogram update (``onnxq/numerics/_histogram.c``), or None: not built (no C
    compiler at install time) or switched off with ``ONNXQ_NO_NATIVE=1``.  Both paths give
    identical counts."""
    if os.environ.get("ONNXQ_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from onnxq.numerics import _histogram  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _histogram


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-thread float32 and intp work buffers of at least ``n`` elements."""
    have = getattr(_local, "size", 0)
    if have < n:
        _local.size = n
        _local.flat = np.empty(n, dtype=np.float32)
        _local.idx = np.empty(n, dtype=np.intp)  # bincount's own index type: no conversion
    return _local.flat[:n], _local.idx[:n]


def count_values(
    counts: np.ndarray, value_range: float, values: np.ndarray, nonnegative: bool = False
) -> None:
    """Count values (an array, possibly a strided view) into ``counts`` (in place), the
    histogram over ``[-value_range, value_range]``; they must lie within it (and be >= 0 when
    ``nonnegative``)."""
    # floor(x * 2^k) is exact while the product cannot underflow, so a value's bin at
    # range 2R is exactly its bin at range R halved: re-binning and batching never move it.
    scale = BINS / (2.0 * value_range)
    flat, idx = _scratch(values.size)  # reused buffers: fresh allocations page-fault
    idx = idx.reshape(values.shape)
    half = BINS // 2
    if nonnegative:
        # x * 2^k >= 0 is exact in float32 (an underflow lands below 1, in bin 0 either
        # way), and for values >= 0 the int conversion's truncation is the floor: one pass
        np.multiply(values, np.float32(scale), out=idx, casting="unsafe")
        counts[half:] += np.bincount(idx.reshape(-1), minlength=half)
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
    counts += np.bincount(idx.reshape(-1), minlength=BINS)


def range_above(amax: float) -> float:
    """The smallest power of two strictly above ``amax`` (at least :data:`MIN_RANGE`): no value
    ever sits on the top edge, so none is clipped into a bin it would not have at a larger
    range."""
    return max(MIN_RANGE, 2.0 ** (math.floor(math.log2(amax)) + 1)) if amax > 0 else MIN_RANGE


def widened(counts: np.ndarray, value_range: float, target: float) -> tuple[np.ndarray, float]:
    """The counts and range after doubling the range (merging bin pairs, exactly) until it
    reaches ``target``; an empty histogram (range 0) takes ``target`` at once."""
    if value_range == 0.0:
        return counts, target
    while value_range < target:
        merged = counts.reshape(-1, 2).sum(axis=1)
        counts = np.zeros(BINS, dtype=np.int64)
        counts[BINS // 4 : BINS // 4 + BINS // 2] = merged
        value_range *= 2.0
    return counts, value_range
