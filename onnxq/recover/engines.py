"""Where AdaRound's arithmetic runs, registered by name (``adaround_engine``): numpy, the
reference, or torch.  An unknown name is a :class:`~onnxq.errors.ConfigError` listing the valid
ones, as for the observers (:data:`onnxq.numerics.observers.METHODS`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnxq.errors import ConfigError
from onnxq.recover.convengine import NumpyConv, TorchConv


@dataclass(frozen=True)
class RoundingEngine:
    """One engine: what runs the block form's convolutions, and whether the per-layer
    optimisation (:func:`onnxq.recover.rounding.learn_rounding`) runs in torch."""

    conv: Callable[[], NumpyConv]
    layer_in_torch: bool


# the values of ``adaround_engine`` (onnxq.config.recovery.ADAROUND_ENGINES lists the same names:
# the config, a lower band, checks them before any engine is built)
ENGINES: dict[str, RoundingEngine] = {
    "numpy": RoundingEngine(conv=NumpyConv, layer_in_torch=False),
    "torch": RoundingEngine(conv=TorchConv, layer_in_torch=True),
}


def get_engine(name: str) -> RoundingEngine:
    """The AdaRound engine registered as ``name``."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"unknown AdaRound engine {name!r}; valid: {', '.join(sorted(ENGINES))}"
        ) from None
