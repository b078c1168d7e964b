"""Allowed values of :class:`onnxq.config.QuantConfig` fields that several modules check: the
accuracy-recovery options (:class:`onnxq.config.options.RecoveryOptions` is their view) and the
weight-only widths and algorithms (:mod:`onnxq.weightonly`)."""

from __future__ import annotations

from typing import Any

from onnxq.errors import ConfigError

CALIBRATION_MODES = ("float", "prefix")
ADAROUND_ENGINES = ("numpy", "torch")
ADAROUND_MODES = ("float", "sequential", "block")
WEIGHT_STORAGE = ("int8", "qdq")  # how static weights are stored (``weight_storage``)
WEIGHT_ONLY = ("int4", "int8")  # the widths of ``--weights`` / ``QuantConfig.weight_only``
WEIGHT_ALGORITHMS = ("auto", "rtn", "gptq", "awq", "awq+gptq")


def check_engine(name: str, value: Any) -> None:
    """Raise :class:`ConfigError` for an unknown AdaRound engine, or torch when it is not
    installed."""
    if value not in ADAROUND_ENGINES:
        raise ConfigError(f"{name}: unknown engine {value!r}; valid: {', '.join(ADAROUND_ENGINES)}")
    if value == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"{name}: torch is not installed; pip install torch, or use numpy"
            ) from None
