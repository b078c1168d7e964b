"""The CPU an onnxruntime-targeted model is tuned for: the one place onnxq reads the CPU.

onnxruntime's int8 kernels behave differently per CPU class.  On x86 without int8 dot
products (AVX2, or AVX-512 without VNNI) its u8 x s8 matrix kernels add each pair of products
in a saturating int16 (``vpmaddubsw``): full-range int8 weights overflow there.  Its u8 x u8
kernels widen both sides to int16 and add pairs in int32 (``vpmaddwd``), exact for every
uint8 weight, so on such a CPU onnxq stores its symmetric 8-bit weights as uint8 (the int8
values + 128, zero point 128): the same numbers, which those kernels compute exactly.  Its
depthwise int8 kernel sums in int32 on every CPU.  Which int8 kernels beat float also differs
per class (``onnxq.backends.cost_tables``).

Everything onnxq derives from the CPU goes through :func:`resolve_target`: the configured class
(``target_cpu`` / ``--target-cpu``), else the environment variable :data:`ENV_VAR`, else the class
of this machine (:func:`detect`).  The environment variable also stands for "this machine" where
onnxq compares a model's target with the machine it runs on, so a test can force every path.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from onnxq.errors import ConfigError

ENV_VAR = "ONNXQ_TARGET_CPU"


@dataclass(frozen=True)
class CpuClass:
    """A class of CPUs on which onnxruntime's int8 kernels behave alike.

    Attributes:
        name: the ``target_cpu`` value.
        description: what the class covers, for messages.
        int16_pair_sums: onnxruntime's u8 x s8 matrix kernels (Conv, Gemm, MatMul; not the
            depthwise conv) add pairs of products in a saturating int16 here, so weights need
            7 bits (or uint8 storage: ``weight_dtype``).
        weight_dtype: the element type onnxq stores 8-bit weights in for onnxruntime here:
            ``uint8`` (the int8 values + 128, zero point 128) picks its u8 x u8 kernels, which
            sum in int32 where the u8 x s8 ones add int16 pairs; ``int8`` elsewhere.
    """

    name: str
    description: str
    int16_pair_sums: bool
    weight_dtype: str = "int8"


CPU_CLASSES: dict[str, CpuClass] = {
    c.name: c
    for c in (
        CpuClass(
            "x86-avx2",
            "x86-64 without int8 dot products (AVX2, or AVX-512 without VNNI)",
            int16_pair_sums=True,
            weight_dtype="uint8",
        ),
        CpuClass(
            "x86-vnni",
            "x86-64 with int8 dot products (AVX-512 VNNI, AVX-VNNI or AMX-INT8)",
            int16_pair_sums=False,
        ),
        CpuClass("arm64", "64-bit Arm without the dot-product extension", int16_pair_sums=False),
        CpuClass("arm64-dot", "64-bit Arm with the dot-product extension", int16_pair_sums=False),
        CpuClass(
            "other", "another architecture (onnxruntime's portable kernels)", int16_pair_sums=False
        ),
    )
}

# /proc/cpuinfo flags of x86 int8 dot products that numpy's feature table does not report
_X86_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_ARM_DOT_FLAGS = frozenset({"asimddp", "dotprod"})
# features that both /proc/cpuinfo and numpy's table report: (OS flag, numpy name)
_BOTH_REPORT = (
    ("avx2", "AVX2"),
    ("fma", "FMA3"),
    ("f16c", "F16C"),
    ("avx512f", "AVX512F"),
    ("avx512bw", "AVX512BW"),
    ("avx512_vnni", "AVX512VNNI"),
)


@dataclass(frozen=True)
class TargetCpu:
    """The CPU class a run targets and where that choice came from."""

    cpu: CpuClass
    source: str  # "config", ENV_VAR, or "this machine"

    @property
    def name(self) -> str:
        """The class name."""
        return self.cpu.name


def cpu_class(name: str, where: str = "target_cpu") -> CpuClass:
    """The class called ``name``; a :class:`ConfigError` listing the valid names otherwise."""
    found = CPU_CLASSES.get(name)
    if found is None:
        raise ConfigError(
            f"{where}: unknown CPU class {name!r}; valid: {', '.join(CPU_CLASSES)} "
            "(`python -m onnxq.backends.which_cpu` prints this machine's)"
        )
    return found


def resolve_target(configured: str | None = None) -> TargetCpu:
    """The target class: ``configured``, else :data:`ENV_VAR`, else this machine's."""
    if configured is not None:
        return TargetCpu(cpu_class(configured), "config")
    return this_machine()


def this_machine() -> TargetCpu:
    """The class of the machine onnxq runs on, as onnxq treats it: :data:`ENV_VAR` if set
    (tests and CI force both paths with it), else :func:`detect`."""
    forced = os.environ.get(ENV_VAR, "").strip()
    if forced:
        return TargetCpu(cpu_class(forced, f"environment variable {ENV_VAR}"), ENV_VAR)
    return TargetCpu(CPU_CLASSES[detect()], "this machine")


def computes_here_as_there(tuned: str) -> bool:
    """Whether onnxruntime on this machine (the class :func:`detect` finds, whatever
    :data:`ENV_VAR` forces) computes an output tuned for the class ``tuned`` as that class
    does: not where this CPU's u8 x s8 kernels add int16 pairs and ``tuned`` stores int8
    weights of the full range, which overflow them (an ``x86-vnni`` output on an AVX2 CPU)."""
    here, there = CPU_CLASSES[detect()], cpu_class(tuned)
    return not (here.int16_pair_sums and there.weight_dtype == "int8")


@functools.lru_cache(maxsize=1)
def detect() -> str:
    """This machine's class, from what the CPU itself reports (cpuid through numpy's feature
    table, which is also what runs under an emulator) and the OS's flag list."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "x86", "i386", "i686"):
        features = _numpy_features()
        flags = _os_flags() if _os_agrees(features) else frozenset()
        dot = features.get("AVX512VNNI", False) or bool(flags & (_X86_DOT_FLAGS - {"avx512_vnni"}))
        if not features:  # no numpy table: the OS's flags alone
            dot = bool(_os_flags() & _X86_DOT_FLAGS)
        return "x86-vnni" if dot else "x86-avx2"
    if machine in ("arm64", "aarch64"):
        if platform.system() == "Darwin":
            return "arm64-dot"  # every Apple arm64 CPU has it
        dot = _numpy_features().get("ASIMDDP", False) or bool(_os_flags() & _ARM_DOT_FLAGS)
        return "arm64-dot" if dot else "arm64"
    return "other"


def _os_agrees(features: dict[str, bool]) -> bool:
    """Whether the OS's flag list describes the CPU that runs us: under an emulator
    (``qemu-x86_64 -cpu Haswell``) /proc/cpuinfo is the host's, and it then lists features
    that cpuid (numpy's table) denies."""
    flags = _os_flags()
    return not any(flag in flags and features.get(key) is False for flag, key in _BOTH_REPORT)


def _numpy_features() -> dict[str, bool]:
    """numpy's run-time CPU feature table (empty if this numpy does not have it)."""
    try:
        from numpy._core._multiarray_umath import (  # type: ignore[import-not-found]
            __cpu_features__,
        )
    except ImportError:
        return {}
    return dict(__cpu_features__)


@functools.lru_cache(maxsize=1)
def _os_flags() -> frozenset[str]:
    """The feature flags the OS lists for this CPU (empty when it lists none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
