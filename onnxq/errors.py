"""One exception family for everything a user can cause, and one for bugs.

Every message says what happened, where (node, tensor, batch, file) and what to do about it.
The CLI prints ``str(error)`` on one line and exits 2 for an :class:`OnnxqError`.
:class:`InternalError` is deliberately *not* a subclass: it means onnxq itself is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass


class OnnxqError(Exception):
    """Base class of every error a user can cause and fix."""


class ModelLoadError(OnnxqError):
    """The model file cannot be read, parsed or checked (includes unsafe external data)."""


class UnsupportedModelError(OnnxqError):
    """The model is valid ONNX but uses something onnxq cannot quantize safely."""


class ConfigError(OnnxqError):
    """An option, a config file key or a value is wrong."""


class CalibrationDataError(OnnxqError):
    """Calibration data is missing, empty, or does not match the model's inputs."""


class AccuracyError(OnnxqError):
    """The quantized model misses an accuracy target the user asked for."""


class OutputError(OnnxqError):
    """The output cannot be written where the user asked."""


@dataclass(frozen=True)
class Violation:
    """One broken backend constraint: which node, which field, what was expected, what was found."""

    node: str
    field: str
    expected: str
    got: str

    def __str__(self) -> str:
        return f"{self.node}: {self.field}: expected {self.expected}, got {self.got}"


class BackendConstraintError(OnnxqError):
    """The quantized model breaks constraints of the target backend."""

    def __init__(self, message: str, violations: list[Violation] | tuple[Violation, ...] = ()):
        super().__init__(message)
        self.violations = tuple(violations)


class InternalError(Exception):
    """A bug in onnxq (not a user error): please report it with the model and the command."""
