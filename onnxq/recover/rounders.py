"""The weight rounders, registered by name (``adaround_mode``): each learns the integer weights
of a model's quantized layers and says what it did.  An unknown name is a
:class:`~onnxq.errors.ConfigError` listing the valid ones, as for the observers
(:data:`onnxq.numerics.observers.METHODS`).  Without ``adaround`` no rounder runs and every
weight rounds to nearest."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import onnx

from onnxq.backends.profile import BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.errors import ConfigError
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.recover.adaround import ChosenWeight, LayerRounding, adaround
from onnxq.recover.blockround import block_adaround
from onnxq.recover.seqround import sequential_adaround

# the chosen weights (by weight tensor) and the report's ``adaround`` section
Rounded = tuple[dict[str, ChosenWeight], dict[str, Any]]
Rounder = Callable[
    [
        onnx.ModelProto,
        Annotations,
        dict[str, QParams],
        BackendProfile,
        RecoveryOptions,
        CalibrationOptions,
        WeightOptions,
        Iterable[Batch],
        list[InputSpec],
    ],
    Rounded,
]


def _layers_section(mode: str, options: RecoveryOptions, layers: list[LayerRounding]) -> dict:
    """The report's section of a rounder that learns layer by layer."""
    return {
        "mode": mode,
        "steps": options.adaround_steps,
        "learned": sum(layer.kept == "learned" for layer in layers),
        "layers": [layer.to_dict() for layer in layers],
    }


def float_rounding(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> Rounded:
    """AdaRound on each layer's float input (``qparams`` unused: nothing before it is
    quantized)."""
    common = (profile, options, calibration, weights, data, inputs)
    chosen, layers = adaround(model, annotations, *common)
    return chosen, _layers_section("float", options, layers)


def sequential_rounding(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> Rounded:
    """AdaRound layer by layer on the quantized prefix (``qparams``: the activation ranges)."""
    common = (profile, options, calibration, weights, data, inputs)
    chosen, layers = sequential_adaround(model, annotations, qparams, *common)
    return chosen, _layers_section("sequential", options, layers)


def block_rounding(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> Rounded:
    """AdaRound block by block of Convs on the quantized prefix (``qparams``: the activation
    ranges)."""
    common = (profile, options, calibration, weights, data, inputs)
    chosen, blocks = block_adaround(model, annotations, qparams, *common)
    section = {
        "mode": "block",
        "steps": options.adaround_steps,
        "learned": sum(len(b.layers) for b in blocks if b.kept == "learned"),
        "blocks": [b.to_dict() for b in blocks],
    }
    return chosen, section


# the values of ``adaround_mode`` (onnxq.config.recovery.ADAROUND_MODES lists the same names, in
# this order: the config, a lower band, checks them before any rounder runs)
ROUNDERS: dict[str, Rounder] = {
    "float": float_rounding,
    "sequential": sequential_rounding,
    "block": block_rounding,
}


def get_rounder(name: str) -> Rounder:
    """The rounder registered as ``name``."""
    try:
        return ROUNDERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown AdaRound mode {name!r}; valid: {', '.join(sorted(ROUNDERS))}"
        ) from None
