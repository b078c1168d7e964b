"""onnxq.numerics.histogram_bins: exact binning, and doubling the range merges bin pairs."""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from onnxq.numerics import tensor_stats
from onnxq.numerics.histogram_bins import (
    BINS,
    MIN_RANGE,
    count_values,
    load_native,
    range_above,
    widened,
)


def test_range_above_is_the_next_power_of_two_strictly_above():
    assert range_above(1.0) == 2.0 and range_above(1.5) == 2.0 and range_above(0.0) == MIN_RANGE


def test_a_value_keeps_its_bin_halved_when_the_range_doubles():
    values = np.array([-0.75, -0.001, 0.0, 0.3, 0.999], dtype=np.float32)
    small = np.zeros(BINS, dtype=np.int64)
    count_values(small, 1.0, values)
    large = np.zeros(BINS, dtype=np.int64)
    count_values(large, 2.0, values)
    merged, value_range = widened(small, 1.0, 2.0)
    assert value_range == 2.0 and np.array_equal(merged, large) and merged.sum() == 5


def test_the_nonnegative_path_counts_the_same_bins():
    values = np.array([0.0, 0.25, 0.5, 0.99], dtype=np.float32)
    signed, unsigned = np.zeros(BINS, dtype=np.int64), np.zeros(BINS, dtype=np.int64)
    count_values(signed, 1.0, values)
    count_values(unsigned, 1.0, values, nonnegative=True)
    assert np.array_equal(signed, unsigned)


def test_an_empty_histogram_takes_the_target_range_at_once():
    counts = np.zeros(BINS, dtype=np.int64)
    assert widened(counts, 0.0, 8.0) == (counts, 8.0)


def test_the_native_update_is_built_where_ci_requires_it(monkeypatch):
    # CI sets ONNXQ_REQUIRE_NATIVE=1: there a missing build is a failure, not a quiet fallback
    if os.environ.get("ONNXQ_REQUIRE_NATIVE") == "1":
        assert tensor_stats._native is not None, (
            "onnxq.numerics._histogram was not built: is a C compiler installed?"
        )
    monkeypatch.setenv("ONNXQ_NO_NATIVE", "1")
    assert load_native() is None
    monkeypatch.setenv("ONNXQ_NO_NATIVE", "0")
    built = importlib.util.find_spec("onnxq.numerics._histogram") is not None
    assert (load_native() is not None) == built
