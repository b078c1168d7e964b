"""Per-node settings (:class:`Override`) and what they resolve to for one tensor.

``exclude`` globs and overrides select nodes by name or op type, or tensors by name; the
placement stage asks them which nodes and tensors stay float and which method, bit width and
scheme each tensor gets (:class:`onnxq.config.options.PlacementOptions`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onnxq.errors import ConfigError


@dataclass(frozen=True)
class Override:
    """Per-node settings, matched by glob over node name, op type or tensor name.

    A field left at ``None`` keeps the global setting.  ``exclude=True`` keeps the matched nodes
    (or, with ``tensor``, the matched tensors) in float.  ``precision`` (``int8``, ``int16``,
    ``fp8``: :data:`onnxq.numerics.precisions.PRECISIONS`) sets the element type of the matched
    tensors; ``bits`` (2-16) narrows the integer range inside that storage (at most 8 for a weight
    or an 8-bit activation); ``per_channel`` (weights) and ``symmetric`` (activations; the
    TensorRT backend only allows symmetric) change the scheme.
    When several overrides match, the later one wins field by field.
    ``block_size`` and ``algorithm`` apply to weight-only runs (``weight_only``): the matched
    layers' block size along K (0: per output channel) and algorithm
    (``onnxq.weightonly.WEIGHT_ALGORITHMS``).
    """

    node: str | None = None
    op_type: str | None = None
    tensor: str | None = None
    method: str | None = None
    exclude: bool = False
    bits: int | None = None
    per_channel: bool | None = None
    symmetric: bool | None = None
    precision: str | None = None
    block_size: int | None = None
    algorithm: str | None = None

    def __post_init__(self) -> None:
        check_override(vars(self), "overrides[]")

    def matches_node(self, node_name: str, op_type: str) -> bool:
        """True if this override's node/op_type patterns (those given) all match."""
        if self.tensor is not None and self.node is None and self.op_type is None:
            return False
        if self.node is not None and not fnmatch.fnmatchcase(node_name, self.node):
            return False
        return self.op_type is None or fnmatch.fnmatchcase(op_type, self.op_type)

    def matches_tensor(self, tensor_name: str) -> bool:
        """True if this override names tensors and ``tensor_name`` matches."""
        return self.tensor is not None and fnmatch.fnmatchcase(tensor_name, self.tensor)

    def describe(self) -> str:
        """``(node=..., op_type=..., tensor=...)``: how messages name this override."""
        parts = [
            f"{k}={getattr(self, k)}" for k in ("node", "op_type", "tensor") if getattr(self, k)
        ]
        return "(" + ", ".join(parts) + ")"


@dataclass(frozen=True)
class TensorSettings:
    """The resolved per-tensor settings (``None``: the backend's default; ``bits=None``: the
    full width of the tensor's element type)."""

    method: str
    bits: int | None = None
    per_channel: bool = True
    symmetric: bool | None = None
    precision: str = "int8"


def check_override(fields: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` (naming the entry as ``where``) unless the override's
    ``fields`` select something and its method, bits and precision are valid."""
    if all(fields.get(key) is None for key in ("node", "op_type", "tensor")):
        raise ConfigError(
            f"{where}: each entry needs at least one of 'node', 'op_type' or 'tensor' "
            "(a glob pattern); got an entry with none"
        )
    if fields.get("method") is not None:
        check_method(fields["method"], f"{where}.method")
    bits = fields.get("bits")
    if bits is not None and (isinstance(bits, bool) or not 2 <= bits <= 16):
        raise ConfigError(f"{where}.bits: must be an integer 2..16, got {bits!r}")
    if fields.get("precision") is not None:
        check_precision(fields["precision"], f"{where}.precision")
    check_weight_only_fields(fields, where)


def check_weight_only_fields(fields: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` unless the override's weight-only ``block_size`` and
    ``algorithm`` (those given) are valid."""
    from onnxq.config.weightonly import WEIGHT_ALGORITHMS

    block = fields.get("block_size")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 0):
        raise ConfigError(
            f"{where}.block_size: expected an integer >= 0 (0: per output channel), got {block!r}"
        )
    algorithm = fields.get("algorithm")
    if algorithm is not None and algorithm not in WEIGHT_ALGORITHMS:
        raise ConfigError(
            f"{where}.algorithm: unknown {algorithm!r}; valid: {', '.join(WEIGHT_ALGORITHMS)}"
        )


def check_method(name: str, where: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a registered range method."""
    from onnxq.numerics.observers import METHODS

    if name not in METHODS:
        raise ConfigError(
            f"{where}: unknown calibration method {name!r}; valid: {', '.join(sorted(METHODS))}"
        )


def check_precision(name: str, where: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a precision (``onnxq.numerics.precisions``)."""
    from onnxq.numerics.precisions import PRECISIONS

    if name not in PRECISIONS:
        raise ConfigError(f"{where}: unknown precision {name!r}; valid: {', '.join(PRECISIONS)}")


def parse_overrides(value: Any, where: str) -> tuple[Override, ...]:
    """The ``overrides`` field from a list of mappings or Overrides (:func:`parse_override`)."""
    return tuple(parse_override(i, v, where) for i, v in enumerate(value))


def parse_override(index: int, value: Any, where: str) -> Override:
    """An :class:`Override` from a mapping (YAML, a dict) or an Override; errors name
    ``overrides[index]`` in ``where``."""
    if isinstance(value, Override):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: overrides[{index}]: expected a mapping")
    valid = {f.name for f in dataclasses.fields(Override)}
    for key in value:
        if key not in valid:
            raise ConfigError(
                f"{where}: overrides[{index}]: unknown key {key!r}; "
                f"valid: {', '.join(sorted(valid))}"
            )
    for key in ("node", "op_type", "tensor", "method", "precision", "algorithm"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise ConfigError(f"{where}: overrides[{index}].{key}: expected a string")
    for key in ("exclude", "per_channel", "symmetric"):
        if value.get(key) is not None and not isinstance(value[key], bool):
            raise ConfigError(f"{where}: overrides[{index}].{key}: expected true or false")
    bits = value.get("bits")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int)):
        raise ConfigError(f"{where}: overrides[{index}].bits: expected an integer 2..16")
    # checked under its own name first: Override() would name it "overrides[]"
    check_override(value, f"{where}: overrides[{index}]")
    return Override(**value)


__all__ = [
    "Override",
    "TensorSettings",
    "check_method",
    "check_override",
    "check_precision",
    "parse_override",
]
