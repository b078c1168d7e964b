"""What the CPU that will run an onnxruntime-targeted model can do."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# Instruction sets that give onnxruntime's u8s8 kernels int32 dot products without the int16
# intermediate sums that saturate (x86: VNNI; Arm: the dot-product extension).
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "dotprod"})


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags of this CPU (empty when the OS does not say)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def has_int8_dot() -> bool:
    """True when int8 dot products do not pass through saturating int16 sums."""
    if platform.machine().lower() in ("arm64", "aarch64") and platform.system() == "Darwin":
        return True
    return bool(cpu_flags() & INT8_DOT_FLAGS)
