"""Exact float sums: one total whatever the order and grouping of the additions."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxq.numerics.exact import exact, exact_sum, rounded

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


@SETTINGS
@given(hnp.arrays(np.float64, st.integers(0, 40), elements=floats), st.integers(0, 40))
def test_a_sum_in_two_parts_is_the_sum_in_one_and_rounds_to_the_true_sum(values, cut):
    total = exact_sum(values)
    assert total == exact_sum(values[:cut]) + exact_sum(values[cut:])
    assert total == exact_sum(values[::-1])
    true = sum((Fraction(float(v)) for v in values), Fraction(0))
    if abs(true) < 2**1023:  # float() of the fraction rounds to nearest, like rounded()
        assert rounded(total) == float(true)


def test_sequential_float_sums_depend_on_the_order_exact_ones_do_not():
    values = np.array([1e16, 1.0, -1e16, 1.0], dtype=np.float64)
    assert sum(values.tolist()) != sum(values[[0, 2, 1, 3]].tolist())  # float rounding
    assert rounded(exact_sum(values)) == rounded(exact_sum(values[[0, 2, 1, 3]])) == 2.0


def test_extremes_are_exact():
    tiny = math.ulp(0.0)  # 2**-1074
    assert exact(tiny) == 1 and rounded(exact(tiny)) == tiny
    assert rounded(exact(-1.5)) == -1.5 and rounded(exact(0.0)) == 0.0
    big = np.finfo(np.float64).max
    assert rounded(exact(big)) == big
    assert exact_sum(np.array([3.0, 1.0], np.float32)) == exact(4.0)
