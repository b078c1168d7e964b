"""How many threads numpy's BLAS and LAPACK use while onnxq's own linear algebra runs.

Weight-only quantization is a long series of small and medium numpy operations per layer
(``X^T X`` of each batch, AWQ's error products, GPTQ's factorisation and row updates).  With
numpy's threaded OpenBLAS these cost far more CPU than one thread does: its threads wait for
each other at every step, spinning, and on a machine whose cores are busy a waiting thread
burns its time slice.  Measured on smollm2_135m (int4 block 128, AWQ+GPTQ; AMD EPYC Zen 4,
2 cores shared with other work, onnxruntime 1.32.0): 344 s of CPU with OpenBLAS's default
threads, 154 s with one, byte-identical output (docs/weight-only.md).  :func:`blas_threads`
limits the BLAS libraries numpy loaded for a block and restores them after; onnxruntime's own
threads are not affected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from threadpoolctl import threadpool_limits

BLAS_THREADS = 1  # measured (above)


@contextlib.contextmanager
def blas_threads(limit: int = BLAS_THREADS) -> Iterator[None]:
    """Run the block with at most ``limit`` threads in every BLAS library loaded (numpy's
    OpenBLAS, MKL, ...); the previous limits are restored on exit."""
    with threadpool_limits(limits=limit, user_api="blas"):
        yield


__all__ = ["BLAS_THREADS", "blas_threads"]
