"""A run's :class:`~onnxq.config.QuantConfig` from what the caller gives: a config, a dict of
its fields or a YAML path, with keyword options on top."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from onnxq.config import QuantConfig
from onnxq.errors import ConfigError


def resolve_config(
    config: QuantConfig | str | os.PathLike[str] | dict[str, Any] | None, **options: Any
) -> QuantConfig:
    """A config from a QuantConfig, a YAML path or a dict, with keyword options on top."""
    if config is None:
        base = QuantConfig()
    elif isinstance(config, QuantConfig):
        base = config
    elif isinstance(config, dict):
        base = QuantConfig.from_dict(config)
    elif isinstance(config, (str, os.PathLike)):
        base = QuantConfig.from_yaml(config)
    else:
        raise ConfigError(
            f"config must be a QuantConfig, a dict or a YAML path, got {type(config).__name__}"
        )
    given = {k: v for k, v in options.items() if v is not None}
    known = {f.name for f in dataclasses.fields(QuantConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r}; valid options: {', '.join(sorted(known))}"
        )
    return base.replace(**given) if given else base


def run_config(
    config: QuantConfig | str | os.PathLike[str] | dict[str, Any] | None,
    backend: str | None,
    method: str | None,
    exclude: Iterable[str] | None,
    options: dict[str, Any],
) -> QuantConfig:
    """The run's config: ``config`` with the keyword arguments of :func:`onnxq.quantize` on
    top (``exclude``: one pattern or several)."""
    if isinstance(exclude, (str, os.PathLike)):
        exclude = [str(exclude)]  # one pattern, not its characters
    patterns = tuple(exclude) if exclude is not None else None
    return resolve_config(config, backend=backend, method=method, exclude=patterns, **options)
