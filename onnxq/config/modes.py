"""Which options each kind of run reads, and the refusal of one that it would ignore.

A run is static INT8 (Q/DQ of weights and activations), dynamic (``dynamic``: activations
quantized at run time by onnxruntime's kernels) or weight-only (``weight_only``).  An option the
kind of run does not read is refused before anything is loaded, with a one-line
:class:`~onnxq.errors.ConfigError` that names it and says what to do: a run never drops an
option silently.  An option counts as given when its value is not QuantConfig's default.

* A weight-only run (:mod:`onnxq.weightonly.pipeline`) reads :data:`WEIGHT_ONLY_READS` alone.
* A dynamic run ignores :data:`DYNAMIC_IGNORES`: with no activation ranges there is nothing to
  calibrate, search or shift, and its kernels take round-to-nearest int8 weights.
* A static or dynamic run ignores the weight-only fields (:data:`WEIGHT_ONLY_FIELDS`).

:func:`refuse_combinations` refuses options that contradict each other (bias correction of a
dynamic run; the half-range shift with an AdaRound mode that learns on the quantized input).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onnxq.config.sections import SECTIONS
from onnxq.errors import ConfigError

# the weight-only section's fields besides the width itself
WEIGHT_ONLY_FIELDS = tuple(n for n in SECTIONS["weightonly"][1] if n != "weight_only")

# the QuantConfig fields a weight-only run reads (its WeightOnlyOptions and what it prepares
# and reads data with)
WEIGHT_ONLY_READS = frozenset(
    {
        "weight_only",
        *WEIGHT_ONLY_FIELDS,
        "backend",
        "exclude",
        "overrides",
        "max_batches",
        "fidelity_batches",
        "progress",
        "preprocess",
        "simplify",
    }
)

# values that mean "off" besides the default (SmoothQuant is on by default for static runs)
OFF = {"smoothquant": (0.0,)}

DYNAMIC_IGNORES = (
    "method",
    "percentile",
    "score_map_ranges",
    "histogram_sample",
    "histogram_budget",
    "weight_storage",
    "calibration_mode",
    "adaround",
    "range_search",
    "sequential_correction",
    "shift_activations",
)

# the keyword arguments of onnxq.quantize() that only a static or dynamic run reads
CALL_OPTIONS = {"target": "target_accuracy", "heldout": "heldout", "executor": "executor"}


def refuse_unused(cfg: Any, **given: Any) -> None:
    """Raise :class:`ConfigError` for the first option of ``cfg`` (or of ``given``: the
    ``target``/``heldout``/``executor`` arguments of :func:`onnxq.quantize`, None: not given)
    that its kind of run would ignore."""
    if cfg.weight_only is not None:
        named = [CALL_OPTIONS[k] for k, v in given.items() if v is not None]
        for name in [*named, *(n for n in _set_fields(cfg) if n not in WEIGHT_ONLY_READS)]:
            raise ConfigError(_weight_only_refusal(name, cfg.weight_only))
        return
    for name in _set_fields(cfg):
        if name in WEIGHT_ONLY_FIELDS:
            raise ConfigError(
                f"{name} applies to weight-only quantization alone: add --weights int4 (or "
                f"int8), or drop {name}"
            )
        if cfg.dynamic and name in DYNAMIC_IGNORES:
            raise ConfigError(
                f"{name} applies to static quantization: --dynamic quantizes activations at "
                f"run time and writes round-to-nearest weights; drop {name}, or drop --dynamic"
            )
        if not cfg.dynamic and name == "dynamic_weight_scales":
            raise ConfigError(
                "dynamic_weight_scales applies to --dynamic alone: add --dynamic (--backend "
                "onnxruntime), or drop it"
            )


def _set_fields(cfg: Any) -> list[str]:
    """The fields of ``cfg`` whose value is not the default (nor another "off" value)."""
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value != f.default and value not in OFF.get(f.name, ()):
            out.append(f.name)
    return out


def _weight_only_refusal(name: str, width: str) -> str:
    """The one line that refuses option ``name`` in a weight-only run of ``width``."""
    if name == "dynamic":
        return (
            "dynamic and weight_only are two kinds of run (activations quantized at run time, "
            f"or float activations): drop --dynamic or --weights {width}"
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


def refuse_combinations(cfg: Any) -> None:
    """Raise :class:`ConfigError` for options that contradict each other."""
    if cfg.dynamic and cfg.bias_correction:
        raise ConfigError(
            "bias_correction corrects the rounding of static quantization; --dynamic "
            "quantizes activations at run time: drop one of them"
        )
    if cfg.shift_activations and cfg.adaround and cfg.adaround_mode != "float":
        raise ConfigError(
            f"shift_activations with adaround_mode {cfg.adaround_mode}: that mode learns each "
            "weight on its layer's quantized input, and a shifted input is not the layer's "
            "input; use adaround_mode float (--adaround) with --shift-activations, or drop one"
        )


__all__ = [
    "DYNAMIC_IGNORES",
    "WEIGHT_ONLY_FIELDS",
    "WEIGHT_ONLY_READS",
    "refuse_combinations",
    "refuse_unused",
]
