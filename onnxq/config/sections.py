"""The sections of a :class:`~onnxq.config.QuantConfig`, by name: each is a frozen dataclass
(:mod:`onnxq.config.options` and the modules beside it) whose fields are declared there once,
and each field belongs to exactly one section, named after the stage that reads it.

The names serve the command line's ``--set SECTION.FIELD=VALUE`` and its ``--help-all``, and
a YAML file, which may nest fields under their section (``recovery: {adaround: true}``) or give
them flat as before (``adaround: true``).  QuantConfig holds one value of each section; the
recipes (:mod:`onnxq.config.recipes`) hold the sections their kind of run reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onnxq.config.calibration import CalibrationOptions
from onnxq.config.fields import check_values, coerce
from onnxq.config.options import (
    AccuracyOptions,
    ProfileOptions,
    RunOptions,
    ValidateOptions,
    WeightOptions,
)
from onnxq.config.placement import PlacementOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.config.weightonly import WeightOnlyOptions
from onnxq.errors import ConfigError

# section -> (what it is, its class); the order is the order of ``--help-all``, of
# ``QuantConfig.to_dict`` and of a YAML file that ``to_yaml`` writes
SECTION_TYPES: dict[str, tuple[str, type]] = {
    "profile": ("the backend profile: backend, dynamic quantization, CPU class", ProfileOptions),
    "placement": (
        "where Q/DQ go: range method, precision, what stays float, the data-driven exclusions",
        PlacementOptions,
    ),
    "calibration": (
        "how the batches are read, observed, cached and shown",
        CalibrationOptions,
    ),
    "weights": ("how weights are stored and their ranges chosen", WeightOptions),
    "recovery": (
        "accuracy recovery: equalization, SmoothQuant, AdaRound, corrections, range search",
        RecoveryOptions,
    ),
    "accuracy": ("an accuracy target (--target) and its search", AccuracyOptions),
    "weightonly": ("weight-only runs (--weights int4|int8)", WeightOnlyOptions),
    "validate": ("the fidelity check against the float model", ValidateOptions),
    "run": ("the run itself: simplify passes, device", RunOptions),
}

# section -> (what it is, its fields)
SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    name: (what, tuple(f.name for f in dataclasses.fields(cls)))
    for name, (what, cls) in SECTION_TYPES.items()
}

SECTION_OF: dict[str, str] = {
    name: section for section, (_, names) in SECTIONS.items() for name in names
}


def checked_fields(data: Any, where: str) -> dict[str, Any]:
    """The fields of a :class:`~onnxq.config.QuantConfig` from a config mapping (flat, or
    fields under their sections: :mod:`onnxq.config.sections`), by name: unknown keys, wrong
    types and invalid values are a :class:`ConfigError` that names ``where`` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of options, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for key, value in flatten(data, where).items():
        if key not in SECTION_OF:
            raise ConfigError(
                f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(SECTION_OF))}"
            )
        cls = SECTION_TYPES[SECTION_OF[key]][1]
        kwargs[key] = coerce(cls, key, value, where)
        check_values(cls, {key: kwargs[key]}, f"{where}: ")  # before the section: name the file
    return kwargs


def flatten(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A config mapping with its sections' fields lifted to the top (``{"recovery":
    {"adaround": True}}`` -> ``{"adaround": True}``); flat keys pass through. A field under
    the wrong section, or given both flat and nested, is a :class:`ConfigError`."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: section {key!r} must be a mapping of its fields "
                    f"({', '.join(SECTIONS[key][1])}), got {type(value).__name__}"
                )
            for name, inner in value.items():
                _check_member(key, str(name), where)
                _put(flat, str(name), inner, where)
        else:
            _put(flat, key, value, where)
    return flat


def parse_setting(text: str) -> tuple[str, Any]:
    """``SECTION.FIELD=VALUE`` (``--set``) as ``(field, value)``; the value is read as a YAML
    scalar or list (``true``, ``8``, ``0.5``, ``[a, b]``, ``int4``), as a config file would
    give it."""
    import yaml

    where = f"--set {text!r}"
    key, sep, raw = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"{where}: expected SECTION.FIELD=VALUE, e.g. recovery.adaround=true")
    if section not in SECTIONS:
        raise ConfigError(
            f"{where}: unknown section {section!r}; valid: {', '.join(SECTIONS)} "
            "(onnxq quantize --help-all lists their fields)"
        )
    _check_member(section, name, where)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw  # not YAML: the text itself (the field's check then judges it)
    return name, value


def _check_member(section: str, name: str, where: str) -> None:
    if name in SECTIONS[section][1]:
        return
    home = SECTION_OF.get(name)
    hint = (
        f"{name!r} is in section {home!r}: {home}.{name}"
        if home
        else f"valid fields of {section}: {', '.join(SECTIONS[section][1])}"
    )
    raise ConfigError(f"{where}: {section} has no field {name!r}; {hint}")


def _put(flat: dict[str, Any], name: str, value: Any, where: str) -> None:
    if name in flat:
        raise ConfigError(f"{where}: {name!r} is given twice (flat and under its section)")
    flat[name] = value
