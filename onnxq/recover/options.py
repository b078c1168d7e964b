"""The allowed values of the accuracy-recovery options of :class:`onnxq.config.QuantConfig`
(declared there; :class:`onnxq.options.RecoveryOptions` is their view)."""

from __future__ import annotations

from typing import Any

from onnxq.errors import ConfigError

CALIBRATION_MODES = ("float", "prefix")
ADAROUND_ENGINES = ("numpy", "torch")
ADAROUND_MODES = ("float", "sequential", "block")


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
