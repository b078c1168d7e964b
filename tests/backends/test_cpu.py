"""The CPU class: detected from what the CPU reports, forced by the environment or the config."""

from __future__ import annotations

import platform

import pytest

from onnxq.backends import cpu
from onnxq.errors import ConfigError


@pytest.fixture
def fake_cpu(monkeypatch):
    """Pretend to be a machine with ``(machine, numpy features, OS flags)``."""

    def set_cpu(machine: str, features: dict[str, bool], flags: set[str], system="Linux"):
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(platform, "system", lambda: system)
        monkeypatch.setattr(cpu, "_numpy_features", lambda: dict(features))
        monkeypatch.setattr(cpu, "_os_flags", lambda: frozenset(flags))
        cpu.detect.cache_clear()

    yield set_cpu
    cpu.detect.cache_clear()


@pytest.mark.parametrize(
    ("machine", "features", "flags", "expected"),
    [
        ("x86_64", {"AVX2": True, "AVX512VNNI": True}, {"avx512_vnni"}, "x86-vnni"),
        ("x86_64", {"AVX2": True, "AVX512VNNI": False}, set(), "x86-avx2"),
        # AVX-512 without VNNI (Skylake-SP): its u8s8 kernels add int16 pairs too
        ("x86_64", {"AVX512F": True, "AVX512VNNI": False}, {"avx512f"}, "x86-avx2"),
        # AVX-VNNI (Alder Lake) and AMX are only in the OS's list
        ("x86_64", {"AVX2": True, "AVX512VNNI": False}, {"avx_vnni"}, "x86-vnni"),
        ("AMD64", {"AVX2": True, "AVX512VNNI": False}, {"amx_int8"}, "x86-vnni"),
        # an emulator (qemu -cpu Haswell) shows the host's /proc/cpuinfo: cpuid decides
        ("x86_64", {"AVX2": True, "AVX512VNNI": False}, {"avx512_vnni"}, "x86-avx2"),
        # ... also of the dot products only the OS lists, when the host has them (Sapphire
        # Rapids: avx_vnni, amx_int8): the OS's list names AVX-512, which cpuid denies
        (
            "x86_64",
            {"AVX2": True, "AVX512F": False, "AVX512VNNI": False},
            {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"},
            "x86-avx2",
        ),
        # a real AVX-VNNI CPU without AVX-512: the lists agree, the OS's flag counts
        ("x86_64", {"AVX2": True, "AVX512F": False}, {"avx2", "avx_vnni"}, "x86-vnni"),
        # no numpy feature table: the OS's flags alone
        ("x86_64", {}, {"avx512_vnni"}, "x86-vnni"),
        ("aarch64", {"ASIMD": True, "ASIMDDP": True}, set(), "arm64-dot"),
        ("aarch64", {"ASIMD": True, "ASIMDDP": False}, {"asimd"}, "arm64"),
        ("aarch64", {}, {"asimddp"}, "arm64-dot"),
        ("riscv64", {}, set(), "other"),
    ],
)
def test_the_class_comes_from_what_the_cpu_reports(fake_cpu, machine, features, flags, expected):
    fake_cpu(machine, features, flags)
    assert cpu.detect() == expected


def test_apple_arm64_has_int8_dot_products(fake_cpu):
    fake_cpu("arm64", {}, set(), system="Darwin")
    assert cpu.detect() == "arm64-dot"


def test_the_environment_variable_stands_for_this_machine(monkeypatch):
    monkeypatch.setenv(cpu.ENV_VAR, "arm64")
    assert (cpu.this_machine().name, cpu.this_machine().source) == ("arm64", cpu.ENV_VAR)
    assert cpu.resolve_target().name == "arm64"
    # the config wins over the environment
    assert (cpu.resolve_target("x86-avx2").name, cpu.resolve_target("x86-avx2").source) == (
        "x86-avx2",
        "config",
    )
    monkeypatch.setenv(cpu.ENV_VAR, "")
    assert cpu.this_machine().source == "this machine"
    assert cpu.this_machine().name == cpu.detect()


def test_an_unknown_class_names_the_valid_ones(monkeypatch):
    with pytest.raises(ConfigError, match="target_cpu: unknown CPU class 'avx2'; valid: x86-avx2"):
        cpu.resolve_target("avx2")
    monkeypatch.setenv(cpu.ENV_VAR, "znver4")
    with pytest.raises(ConfigError, match="environment variable ONNXQ_TARGET_CPU: unknown"):
        cpu.this_machine()


def test_only_x86_without_int8_dot_products_adds_int16_pairs():
    assert [c.name for c in cpu.CPU_CLASSES.values() if c.int16_pair_sums] == ["x86-avx2"]


@pytest.mark.parametrize(
    ("machine", "tuned", "same"),
    [
        ("x86-avx2", "x86-vnni", False),  # full-range int8 weights overflow int16 pair sums
        ("x86-avx2", "arm64-dot", False),
        ("x86-avx2", "x86-avx2", True),  # uint8 weights: u8 x u8 kernels, int32 sums
        ("x86-vnni", "x86-avx2", True),
        ("x86-vnni", "x86-vnni", True),
        ("arm64-dot", "x86-vnni", True),
    ],
)
def test_an_output_computes_here_as_on_its_class_unless_its_weights_overflow_here(
    monkeypatch, machine, tuned, same
):
    monkeypatch.setattr(cpu, "detect", lambda: machine)
    monkeypatch.setenv(cpu.ENV_VAR, "x86-vnni")  # forcing a class does not change the machine
    assert cpu.computes_here_as_there(tuned) is same


def test_the_tests_skip_fused_numerics_only_where_this_machine_cannot_compute_them(monkeypatch):
    from tests.cpus import skip_unless_fused_numerics_here

    monkeypatch.setattr(cpu, "detect", lambda: "x86-avx2")
    monkeypatch.setenv(cpu.ENV_VAR, "x86-avx2")
    skip_unless_fused_numerics_here()  # uint8 weights: computed exactly here
    monkeypatch.setenv(cpu.ENV_VAR, "x86-vnni")
    with pytest.raises(pytest.skip.Exception, match="ONNXQ_TARGET_CPU=x86-vnni on a x86-avx2 "):
        skip_unless_fused_numerics_here()
    with pytest.raises(pytest.skip.Exception, match="an output tuned for arm64-dot on a x86-avx2"):
        skip_unless_fused_numerics_here("arm64-dot")
    monkeypatch.setattr(cpu, "detect", lambda: "x86-vnni")
    skip_unless_fused_numerics_here()
