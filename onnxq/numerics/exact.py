"""Exact sums of floats: one total whatever the order and grouping of the additions.

Floating-point addition rounds at every step, so a sum taken batch by batch differs in its last
bits from the same sum taken shard by shard and merged.  Every finite float64 is an integer
multiple of 2**-1074, so a sum kept as an integer count of that unit is exact, and merging two
of them is integer addition; :func:`rounded` rounds the total once, when it is read.
"""

from __future__ import annotations

import numpy as np

UNIT_BITS = 1074  # every finite float64 is an integer multiple of 2**-UNIT_BITS
_ONE = 1 << UNIT_BITS


def exact_sum(values: np.ndarray) -> int:
    """The sum of ``values`` (finite floats), exactly, in units of 2**-1074."""
    total = 0
    for value in values.ravel().tolist():
        numerator, denominator = float(value).as_integer_ratio()  # denominator: a power of 2
        total += numerator << (UNIT_BITS + 1 - denominator.bit_length())
    return total


def exact(value: float) -> int:
    """One finite float in units of 2**-1074 (no rounding)."""
    return exact_sum(np.asarray([value], dtype=np.float64))


def rounded(total: int) -> float:
    """An exact total (units of 2**-1074) as the nearest float."""
    return total / _ONE  # int / int rounds correctly (to nearest, ties to even)
