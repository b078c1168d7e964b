"""numpy's BLAS threads limited for a block and restored after."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info

from onnxq.runtime.blas import BLAS_THREADS, blas_threads


def _blas_threads() -> list[int]:
    return [int(x["num_threads"]) for x in threadpool_info() if x["user_api"] == "blas"]


def test_inside_the_block_blas_runs_the_limit_and_after_it_what_it_ran_before():
    np.ones((4, 4)) @ np.ones((4, 4))  # numpy's BLAS is loaded
    before = _blas_threads()
    assert before  # numpy ships a BLAS threadpoolctl can see
    with blas_threads():
        assert _blas_threads() == [BLAS_THREADS] * len(before)
    assert _blas_threads() == before


def test_products_are_the_same_with_one_thread():
    r = np.random.default_rng(0)
    x = r.standard_normal((2048, 384)).astype(np.float32)  # large enough to be split
    w = r.standard_normal((384, 256)).astype(np.float32)
    threaded = (x.T @ x, x @ w)
    with blas_threads():
        assert np.array_equal(x.T @ x, threaded[0])
        assert np.array_equal(x @ w, threaded[1])
