"""The sections of a :class:`~onnxq.config.QuantConfig`: each field belongs to exactly one,
named after the stage that reads it.

The sections group the options for the command line's ``--set SECTION.FIELD=VALUE`` and its
``--help-all``, and for a YAML file, which may nest fields under their section
(``recovery: {adaround: true}``) or give them flat as before (``adaround: true``). A test
holds this table and QuantConfig's fields together: a new field must be given a section here.
"""

from __future__ import annotations

from typing import Any

from onnxq.errors import ConfigError

# section -> (what it is, its fields); the order is the order of ``--help-all``
SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "profile": (
        "the backend profile: backend, precision, the CPU class it is tuned for",
        ("backend", "precision", "dynamic", "reduce_range", "target_cpu", "cost_table"),
    ),
    "placement": (
        "where Q/DQ go: range method, what stays float, the data-driven exclusions",
        (
            "method",
            "exclude",
            "exclude_op_types",
            "exclude_modules",
            "overrides",
            "min_channels",
            "mask_threshold",
            "concat_range_ratio",
            "weak_channel_fraction",
            "weak_position_fraction",
            "dynamic_weight_scales",
            "score_map_ranges",
        ),
    ),
    "calibration": (
        "how the batches are read and observed",
        (
            "percentile",
            "max_batches",
            "memory_budget_mb",
            "histogram_sample",
            "histogram_budget",
            "preprocess",
        ),
    ),
    "weights": (
        "how weights are stored and their ranges chosen",
        ("weight_storage", "weight_method"),
    ),
    "recovery": (
        "accuracy recovery: equalization, SmoothQuant, the shift, AdaRound, corrections",
        (
            "cle",
            "dw_equalization",
            "smoothquant",
            "smoothquant_min_spread",
            "shift_activations",
            "calibration_mode",
            "adaround",
            "adaround_steps",
            "adaround_rows",
            "adaround_engine",
            "adaround_mode",
            "sequential_correction",
            "range_search",
            "range_search_batches",
            "bias_correction",
        ),
    ),
    "accuracy": (
        "an accuracy target (--target) and its search",
        ("target_accuracy", "heldout_batches", "target_cost", "target_max_float_macs"),
    ),
    "weightonly": (
        "weight-only runs (--weights int4|int8)",
        (
            "weight_only",
            "block_size",
            "weight_algorithm",
            "weight_symmetric",
            "weight_accuracy_level",
        ),
    ),
    "validate": (
        "the fidelity check against the float model",
        ("fidelity_batches", "agreement_threshold"),
    ),
    "run": (
        "the run itself: simplify passes, progress bar, device",
        ("simplify", "progress", "device"),
    ),
}

SECTION_OF: dict[str, str] = {
    name: section for section, (_, names) in SECTIONS.items() for name in names
}


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
