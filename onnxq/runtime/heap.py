"""Handing memory freed by a released onnxruntime session back to the system.

glibc keeps what small and medium allocations free (onnxruntime's initializers and buffers,
numpy arrays under its dynamic mmap threshold) in its heaps for reuse: after the session of a
float LM was released, the process that quantized smollm2_135m (655 MB) still held 560 MB of
it, and its next allocations (the fidelity check's copies of the logits) came on top.
:func:`release_free_memory` asks glibc's ``malloc_trim`` to return that memory; with a C
library that has no such call (macOS, musl, Windows) it does nothing.  The C library is looked
up in one place, :func:`trim_function`, which a test can replace to force either path.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.lru_cache(maxsize=1)
def trim_function() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim(pad)``, or None where the process's C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> bool:
    """Return the C library's free heap memory to the system; False where it cannot."""
    trim = trim_function()
    if trim is None:
        return False
    trim(0)
    return True


__all__ = ["release_free_memory", "trim_function"]
