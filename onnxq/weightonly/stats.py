"""Streamed statistics of a layer group's input: ``X^T X`` and the channels' mean magnitude.

Memory is ``K x K`` float64 whatever the number of tokens; each batch is folded in and dropped.
"""

from __future__ import annotations

import numpy as np


class InputStats:
    """``X^T X`` (the Hessian of the squared output error, up to a factor 2), the sum of
    ``|x|`` per channel and the row count of one layer input with ``k`` channels."""

    def __init__(self, k: int):
        self.k = k
        self.gram = np.zeros((k, k), np.float64)
        self.abs_sum = np.zeros(k, np.float64)
        self.rows = 0

    def update(self, x: np.ndarray) -> None:
        """Fold in a batch whose last axis holds the ``k`` channels."""
        rows = np.asarray(x, np.float32).reshape(-1, self.k)
        self.gram += rows.T @ rows
        self.abs_sum += np.abs(rows).sum(axis=0, dtype=np.float64)
        self.rows += len(rows)

    @property
    def hessian(self) -> np.ndarray:
        """``X^T X / rows`` (float64)."""
        return self.gram / max(self.rows, 1)

    @property
    def mean_abs(self) -> np.ndarray:
        """Mean ``|x|`` per channel."""
        return self.abs_sum / max(self.rows, 1)
