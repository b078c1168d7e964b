"""The recipes: one small frozen type per kind of run, made of the sections it reads.

* :class:`StaticRecipe`: Q/DQ of weights and activations, ranges calibrated ahead of time;
* :class:`DynamicRecipe`: activations quantized at run time by onnxruntime's kernels
  (``dynamic``), round-to-nearest int8 weights;
* :class:`WeightOnlyRecipe`: int4/int8 MatMul/Gemm weights, activations untouched
  (``weight_only``).

A recipe holds only the sections its kind reads, so an option of another kind cannot be
written into it (a weight-only recipe has no ``recovery``); inside a section it holds, an option
its kind ignores is refused at construction with a one-line :class:`~onnxq.errors.ConfigError`
that names it and says what to do, as are options that contradict each other.  An option
counts as given when its value is not its section's default (nor another "off" value).

:func:`recipe_for` (``QuantConfig.recipe()``) turns the options a user gave, in a
:class:`~onnxq.config.QuantConfig`, into the recipe of their kind, refusing the options of a
section that kind does not hold.  The pipeline (:mod:`onnxq.api`) runs a recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from onnxq.backends.profile import BackendProfile
from onnxq.backends.target import profile_for
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import (
    AccuracyOptions,
    ProfileOptions,
    RunOptions,
    ValidateOptions,
    WeightOptions,
)
from onnxq.config.placement import PlacementOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.config.sections import SECTION_OF, SECTIONS
from onnxq.config.weightonly import WeightOnlyOptions
from onnxq.errors import ConfigError


class Options(Protocol):
    """What a recipe is made from: one value of each section (a
    :class:`~onnxq.config.QuantConfig`)."""

    @property
    def profile(self) -> ProfileOptions: ...
    @property
    def placement(self) -> PlacementOptions: ...
    @property
    def calibration(self) -> CalibrationOptions: ...
    @property
    def weights(self) -> WeightOptions: ...
    @property
    def recovery(self) -> RecoveryOptions: ...
    @property
    def accuracy(self) -> AccuracyOptions: ...
    @property
    def weightonly(self) -> WeightOnlyOptions: ...
    @property
    def validate(self) -> ValidateOptions: ...
    @property
    def run(self) -> RunOptions: ...


# values that mean "off" besides the default (SmoothQuant is on by default for static runs)
OFF: dict[str, tuple[Any, ...]] = {"smoothquant": (0.0,)}


def given(section: Any) -> list[str]:
    """The fields of ``section`` whose value is not the default (nor another "off" value)."""
    out = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if value != f.default and value not in OFF.get(f.name, ()):
            out.append(f.name)
    return out


def _flat(recipe: Any) -> dict[str, Any]:
    from onnxq.config.fields import plain_fields

    return {
        k: v for name in recipe.SECTIONS for k, v in plain_fields(getattr(recipe, name)).items()
    }


@dataclass(frozen=True)
class ActivationRecipe:
    """What a run that quantizes activations reads (static or dynamic): every section but
    ``weightonly``."""

    profile: ProfileOptions = field(default_factory=ProfileOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    weights: WeightOptions = field(default_factory=WeightOptions)
    recovery: RecoveryOptions = field(default_factory=RecoveryOptions)
    accuracy: AccuracyOptions = field(default_factory=AccuracyOptions)
    validate: ValidateOptions = field(default_factory=ValidateOptions)
    run: RunOptions = field(default_factory=RunOptions)

    KIND: ClassVar[str] = ""
    SECTIONS: ClassVar[tuple[str, ...]] = (
        "profile",
        "placement",
        "calibration",
        "weights",
        "recovery",
        "accuracy",
        "validate",
        "run",
    )

    def to_dict(self) -> dict[str, Any]:
        """The fields of the sections this recipe holds, flat (the report's ``config``)."""
        return _flat(self)

    def backend_profile(self) -> tuple[BackendProfile, str]:
        """The run's backend profile and its weight-range note (``QuantConfig.backend_profile``)."""
        return profile_for(self.profile, self.placement.precisions(), self.placement.high_precision)

    def replace(self, **sections: Any) -> Any:
        """A copy with some sections replaced, checked again."""
        return dataclasses.replace(self, **sections)


@dataclass(frozen=True)
class StaticRecipe(ActivationRecipe):
    """Static quantization: Q/DQ of weights and activations, ranges calibrated ahead of time."""

    KIND: ClassVar[str] = "static"

    def __post_init__(self) -> None:
        if self.profile.dynamic:
            raise ConfigError(
                "a static recipe with dynamic: true: use DynamicRecipe (or drop --dynamic)"
            )
        if "dynamic_weight_scales" in given(self.placement):
            raise ConfigError(
                "dynamic_weight_scales applies to --dynamic alone: add --dynamic (--backend "
                "onnxruntime), or drop it"
            )
        rec = self.recovery
        if self.placement.shift_activations and rec.adaround and rec.adaround_mode != "float":
            raise ConfigError(
                f"shift_activations with adaround_mode {rec.adaround_mode}: that mode learns "
                "each weight on its layer's quantized input, and a shifted input is not the "
                "layer's input; use adaround_mode float (--adaround) with "
                "--shift-activations, or drop one"
            )


# the options a dynamic run ignores, by section: with no activation ranges there is nothing
# to calibrate, search or shift, and its kernels take round-to-nearest int8 weights
DYNAMIC_IGNORES: dict[str, tuple[str, ...]] = {
    "placement": (
        "method",
        "score_map_ranges",
        "shift_activations",
        "high_precision",
        "keep_io_types",
    ),
    "calibration": ("percentile", "histogram_sample", "histogram_budget"),
    "weights": ("weight_storage",),
    "recovery": (
        "calibration_mode",
        "adaround",
        "adaround_steps",
        "adaround_rows",
        "adaround_mode",
        "range_search",
        "range_search_batches",
        "sequential_correction",
    ),
}


@dataclass(frozen=True)
class DynamicRecipe(ActivationRecipe):
    """Dynamic quantization (onnxruntime backend): int8 weights written ahead of time,
    activations quantized at run time by onnxruntime's kernels; ``profile.dynamic`` is set."""

    KIND: ClassVar[str] = "dynamic"

    def __post_init__(self) -> None:
        if not self.profile.dynamic:
            object.__setattr__(self, "profile", dataclasses.replace(self.profile, dynamic=True))
        if self.calibration.save_calibration or self.calibration.load_calibration:
            raise ConfigError(
                "--dynamic quantizes activations at run time and keeps no calibration "
                "statistics: drop --save-calibration / --load-calibration (--calib, if given, "
                "only feeds the fidelity check)"
            )
        if self.recovery.bias_correction:
            raise ConfigError(
                "bias_correction corrects the rounding of static quantization; --dynamic "
                "quantizes activations at run time: drop one of them"
            )
        for section, names in DYNAMIC_IGNORES.items():
            for name in given(getattr(self, section)):
                if name in names:
                    raise ConfigError(
                        f"{name} applies to static quantization: --dynamic quantizes "
                        "activations at run time and writes round-to-nearest weights; drop "
                        f"{name}, or drop --dynamic"
                    )


# what a weight-only run reads of the sections it shares with the others (None: all of it)
WEIGHT_ONLY_READS: dict[str, frozenset[str] | None] = {
    "profile": frozenset({"backend"}),
    "placement": frozenset({"exclude", "overrides"}),
    "calibration": frozenset(
        {
            "max_batches",
            "batch_size",
            "fidelity_batches",
            "preprocess",
            "progress",
        }
    ),
    "weightonly": None,
    "run": frozenset({"simplify"}),
}


@dataclass(frozen=True)
class WeightOnlyRecipe:
    """Weight-only quantization: int4/int8 MatMul/Gemm weights (``weightonly.weight_only``),
    activations untouched; no recovery, accuracy target or fidelity options to write."""

    weightonly: WeightOnlyOptions
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    run: RunOptions = field(default_factory=RunOptions)

    KIND: ClassVar[str] = "weight-only"
    SECTIONS: ClassVar[tuple[str, ...]] = tuple(WEIGHT_ONLY_READS)

    def __post_init__(self) -> None:
        width = self.weightonly.weight_only
        if width is None:
            raise ConfigError("a weight-only recipe needs weight_only: int4 or int8")
        for section, reads in WEIGHT_ONLY_READS.items():
            for name in given(getattr(self, section)):
                if reads is not None and name not in reads:
                    raise ConfigError(weight_only_refusal(name, width))

    def to_dict(self) -> dict[str, Any]:
        """The fields this recipe reads, flat (the report's ``config``)."""
        return {
            k: v
            for k, v in _flat(self).items()
            if (reads := WEIGHT_ONLY_READS[SECTION_OF[k]]) is None or k in reads
        }


Recipe = StaticRecipe | DynamicRecipe | WeightOnlyRecipe


def weight_only_refusal(name: str, width: str) -> str:
    """The one line that refuses option ``name`` in a weight-only run of ``width``."""
    if name == "dynamic":
        return (
            "dynamic and weight_only are two kinds of run (activations quantized at run time, "
            f"or float activations): drop --dynamic or --weights {width}"
        )
    if name in ("save_calibration", "load_calibration"):
        return (
            f"{name}: weight-only quantization (--weights {width}) keeps no calibration "
            "statistics: drop --save-calibration / --load-calibration"
        )
    if name == "device":
        return (
            f"device: weight-only quantization (--weights {width}) runs on the CPU: drop "
            "--device, or drop --weights for INT8 of weights and activations"
        )
    return (
        f"{name}: weight-only quantization (--weights {width}) does not use it (activations "
        f"stay float): drop {name}, or drop --weights for INT8 of weights and activations"
    )


def recipe_for(config: Options) -> Recipe:
    """The recipe of the run ``config`` asks for: weight-only when ``weight_only`` is set,
    dynamic with ``dynamic``, else static.  An option given in a section that kind does not
    hold is refused here, one the kind ignores inside a section it holds by the recipe."""
    width = config.weightonly.weight_only
    kind: type[StaticRecipe] | type[DynamicRecipe] | type[WeightOnlyRecipe]
    kind = WeightOnlyRecipe if width is not None else StaticRecipe
    if width is None and config.profile.dynamic:
        kind = DynamicRecipe
    for section in SECTIONS:
        if section in kind.SECTIONS:
            continue
        for name in given(getattr(config, section)):
            if width is not None:
                raise ConfigError(weight_only_refusal(name, width))
            raise ConfigError(
                f"{name} applies to weight-only quantization alone: add --weights int4 (or "
                f"int8), or drop {name}"
            )
    return kind(**{name: getattr(config, name) for name in kind.SECTIONS})


def refuse_call_options(recipe: Recipe, **call: Any) -> None:
    """Raise :class:`ConfigError` when a weight-only ``recipe`` is given one of the
    accuracy-target arguments of :func:`onnxq.quantize` (``target``, ``executor``; None: not
    given): a weight-only run has no trials to measure or spread."""
    if not isinstance(recipe, WeightOnlyRecipe):
        return
    names = {"target": "target_accuracy", "executor": "executor"}
    for key, value in call.items():
        if value is not None:
            raise ConfigError(
                weight_only_refusal(names.get(key, key), recipe.weightonly.weight_only or "")
            )


__all__ = [
    "DYNAMIC_IGNORES",
    "WEIGHT_ONLY_READS",
    "ActivationRecipe",
    "DynamicRecipe",
    "Recipe",
    "StaticRecipe",
    "WeightOnlyRecipe",
    "recipe_for",
    "refuse_call_options",
    "weight_only_refusal",
]
