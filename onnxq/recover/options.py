"""The accuracy-recovery options of :class:`onnxq.config.QuantConfig`: their allowed values and
their validation, in one place."""

from __future__ import annotations

from typing import Any

from onnxq.errors import ConfigError

CALIBRATION_MODES = ("float", "prefix")
ADAROUND_ENGINES = ("numpy", "torch")


def check_recovery_options(config: Any) -> None:
    """Raise :class:`ConfigError` for an invalid recovery field of ``config``."""
    alpha = config.smoothquant
    if alpha is not None and not 0.0 < float(alpha) <= 1.0:
        raise ConfigError(f"smoothquant: alpha must be in (0, 1], got {alpha!r}")
    _choice("calibration_mode", config.calibration_mode, CALIBRATION_MODES)
    _choice("adaround_engine", config.adaround_engine, ADAROUND_ENGINES)
    if config.adaround_steps < 0:
        raise ConfigError(f"adaround_steps: must be >= 0, got {config.adaround_steps}")
    if config.adaround_rows < 1:
        raise ConfigError(f"adaround_rows: must be >= 1, got {config.adaround_rows}")
    if config.adaround_engine == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(
                "adaround_engine: torch is not installed; pip install torch, or use numpy"
            ) from None


def _choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{name}: got {value!r}; valid: {', '.join(valid)}")
