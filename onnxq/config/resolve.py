"""A run's :class:`~onnxq.config.QuantConfig` from what the caller gives: a config, a dict of
its fields or a YAML path, with keyword options on top."""

from __future__ import annotations

import os
from typing import Any

from onnxq.config import QuantConfig
from onnxq.config.recipes import DynamicRecipe, Recipe, StaticRecipe, WeightOnlyRecipe
from onnxq.errors import ConfigError

ConfigLike = QuantConfig | Recipe | str | os.PathLike[str] | dict[str, Any] | None
"""What a caller may give as a config: a QuantConfig, a recipe, a YAML path, a dict of fields
(flat or by section), or None (the defaults)."""


def resolve_config(config: ConfigLike, **options: Any) -> QuantConfig:
    """A config from a QuantConfig, a recipe, a YAML path or a dict, with keyword options on
    top."""
    if config is None:
        base = QuantConfig()
    elif isinstance(config, QuantConfig):
        base = config
    elif isinstance(config, (StaticRecipe, DynamicRecipe, WeightOnlyRecipe)):
        base = QuantConfig(**{name: getattr(config, name) for name in config.SECTIONS})
    elif isinstance(config, dict):
        base = QuantConfig.from_dict(config)
    elif isinstance(config, (str, os.PathLike)):
        base = QuantConfig.from_yaml(config)
    else:
        raise ConfigError(
            f"config must be a QuantConfig, a recipe, a dict or a YAML path, got "
            f"{type(config).__name__}"
        )
    given = {k: v for k, v in options.items() if v is not None}
    known = set(QuantConfig.field_names())
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r}; valid options: {', '.join(sorted(known))}"
        )
    return base.replace(**given) if given else base


# keyword arguments of onnxq.quantize() that moved, and where they went
MOVED = {
    "heldout": (
        "heldout= moved into the target: quantize(..., target=AccuracyTarget(metric, value, "
        "heldout=DATA)) (onnxq.numerics.accuracy_target; docs/mixed_precision.md)"
    ),
}


def run_config(config: ConfigLike, options: dict[str, Any]) -> QuantConfig:
    """The run's config: ``config`` with the keyword options of :func:`onnxq.quantize` on
    top (``exclude``: one pattern or several); a keyword that moved is a one-line
    :class:`ConfigError` saying where it went."""
    for name in options:
        if name in MOVED:
            raise ConfigError(MOVED[name])
    exclude = options.get("exclude")
    if isinstance(exclude, (str, os.PathLike)):
        options = {**options, "exclude": [str(exclude)]}  # one pattern, not its characters
    elif exclude is not None:
        options = {**options, "exclude": tuple(exclude)}
    return resolve_config(config, **options)
