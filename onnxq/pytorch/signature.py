"""The module's call as the exporter sees it: the example inputs as positional arguments,
``forward``'s parameter names, and the outputs flattened in the exporter's order and named."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxq.errors import ConfigError, UnsupportedModelError
from onnxq.pytorch.compat import non_tensor_hint


def call_module(module: Any, args: tuple[Any, ...]) -> Any:
    """The module's outputs on the example inputs; a failing call names forward's parameters."""
    try:
        return module(*args)
    except Exception as exc:
        params = ", ".join(positional_params(module)[: len(args) + 2]) + ", ..."
        raise ConfigError(
            f"calling {type(module).__name__} on example_inputs failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}; example_inputs are passed "
            f"positionally to forward({params}), in that order"
        ) from exc


def as_args(torch: Any, example_inputs: Any) -> tuple[Any, ...]:
    """The example inputs as a tuple of tensors (numpy arrays converted)."""
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    args = tuple(torch.from_numpy(t) if isinstance(t, np.ndarray) else t for t in items)
    for i, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            raise ConfigError(
                f"example_inputs[{i}]: expected a tensor or a numpy array, got {type(arg).__name__}"
            )
    return args


def positional_params(module: Any) -> list[str]:
    """The names of ``forward``'s positional parameters ([] when it has no signature)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def forward_names(module: Any, args: tuple[Any, ...]) -> list[str]:
    """The default input names: ``forward``'s parameters, else ``input`` / ``input_0, ...``."""
    named = positional_params(module)
    if len(named) >= len(args):
        return named[: len(args)]
    return ["input"] if len(args) == 1 else [f"input_{i}" for i in range(len(args))]


def flatten_outputs(value: Any, name: str) -> list[tuple[str, Any]]:
    """Output tensors in the exporter's order, named by dict key / position."""
    if isinstance(value, Mapping):
        return [
            pair
            for k, v in value.items()
            for pair in flatten_outputs(v, str(k) if name == "output" else f"{name}.{k}")
        ]
    if isinstance(value, (tuple, list)):
        return [pair for i, v in enumerate(value) for pair in flatten_outputs(v, f"{name}_{i}")]
    if value is None or not hasattr(value, "detach"):
        raise UnsupportedModelError(
            f"module output {name!r} is a {type(value).__name__}, not a tensor; "
            f"{non_tensor_hint(value)}"
        )
    return [(name, value)]
