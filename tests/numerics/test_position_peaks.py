"""onnxq.numerics.position_peaks: positions counted by their peak over the channels."""

from __future__ import annotations

import numpy as np

from onnxq.numerics.position_peaks import count_positions, weak_share


def test_weak_positions_are_above_zero_and_far_below_the_peak():
    x = np.zeros((1, 2, 4), dtype=np.float32)
    x[0, 0, 0] = 1.0  # the peak
    x[0, 1, 1] = -0.01  # weak
    x[0, 0, 2] = 0.5  # not weak
    counts = count_positions(x, nonnegative=False)
    assert counts.sum() == 4
    assert weak_share(counts, 1.0, 1 / 16) == (1, 4)  # the all-zero position is not weak
    assert weak_share(counts, 0.0, 1 / 16) is None
