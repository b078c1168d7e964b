"""The ranges the output-driven range search tries for one activation."""

from __future__ import annotations

import pytest

from onnxq.numerics.qparams import range_to_qparams
from onnxq.recover.rangegrid import Grid, candidates


def test_the_current_range_comes_first_then_scaled_ones_then_the_observers():
    current = range_to_qparams(-4.0, 4.0, "int8", True, "entropy")
    observed = range_to_qparams(-3.0, 3.0, "int8", True, "mse")
    grid = candidates(current, (1.2, 0.5), Grid("int8", True, None), None, observed)
    assert [c.label for c in grid] == ["x1", "x1.2", "x0.5", "mse"]
    assert grid[0].qparams is current
    assert [c.qparams.high for c in grid] == pytest.approx([4.0, 4.8, 2.0, 3.0])
    assert [c.factor for c in grid] == pytest.approx([1.0, 1.2, 0.5, 0.75], rel=1e-6)


def test_bounds_cap_a_scaled_range_and_duplicates_are_left_out():
    current = range_to_qparams(0.0, 6.0, "uint8", False, "minmax")
    # the readers saturate at 6: x1.2 is the current range again, x0.9 stays
    grid = candidates(current, (1.2, 0.9), Grid("uint8", False, None), (0.0, 6.0), current)
    assert [c.label for c in grid] == ["x1", "x0.9"]
    assert grid[1].qparams.low == 0.0 and grid[1].qparams.high == pytest.approx(5.4)


def test_a_narrowed_bit_width_keeps_its_levels():
    current = range_to_qparams(-1.0, 1.0, "int8", True, "minmax", bits=4)
    grid = candidates(current, (0.5,), Grid("int8", True, 4), None)
    assert float(grid[1].qparams.scale) == pytest.approx(0.5 / 7)
