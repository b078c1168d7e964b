"""One exception family for everything a user can cause, and one for bugs.

Every message says what happened, where (node, tensor, batch, file) and what to do about it.
The CLI prints ``str(error)`` on one line and exits 2 for an :class:`OnnxqError` (1 for an
:class:`AccuracyError`, and for a :class:`BackendConstraintError` that lists violations, as
for a failed check).  :class:`InternalError` is deliberately *not* a subclass: it means onnxq
itself is wrong, and the CLI exits 3 for it (``onnxq.cli.EXIT_CODES``).
"""

from __future__ import annotations

from dataclasses import dataclass


class OnnxqError(Exception):
    """Base class of every error a user can cause and fix.

    ``onnxruntime_failed``: onnxruntime refused or failed on a model; the pipeline then adds
    what onnxq changed in the model before (an opset conversion) as a note on the error.
    """

    def __init__(self, *args: object, onnxruntime_failed: bool = False) -> None:
        super().__init__(*args)
        self.onnxruntime_failed = onnxruntime_failed


class ModelLoadError(OnnxqError):
    """The model file cannot be read, parsed or checked (includes unsafe external data)."""


class UnsupportedModelError(OnnxqError):
    """The model is valid ONNX but uses something onnxq cannot quantize safely, or does not run
    in onnxruntime (on the calibration data)."""


class ConfigError(OnnxqError):
    """An option, a config file key or a value is wrong."""


class CalibrationDataError(OnnxqError):
    """Calibration data is missing, empty, or does not match the model's inputs."""


class AccuracyError(OnnxqError):
    """The quantized model misses an accuracy target the user asked for.

    Raised by the step that compares the quantized model with its target; the CLI exits 1 for
    it, as for a check that finds violations: the run worked, its result falls short.
    """


class OutputError(OnnxqError):
    """The output cannot be written where the user asked."""


class ResourceError(OnnxqError):
    """What the run asked to run on is missing or failing: a CUDA device (``--device cuda``),
    a Ray cluster or its workers (``--ray``)."""


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
    """A model breaks constraints of the target backend (``violations``, when known)."""

    def __init__(
        self,
        message: str,
        violations: list[Violation] | tuple[Violation, ...] = (),
        *,
        onnxruntime_failed: bool = False,
    ) -> None:
        super().__init__(message, onnxruntime_failed=onnxruntime_failed)
        self.violations = tuple(violations)


REPORT_REQUEST = (
    "this is a bug in onnxq, not in your model or data: please report it with the model (or "
    "its name and where it comes from), the node or op named above and the command"
)


class InternalError(Exception):
    """A bug in onnxq (not a user error): its own pass crashed, or its own output breaks the
    backend's constraints or fails in onnxruntime.  The message ends asking for a report."""

    def __init__(self, message: str, *, onnxruntime_failed: bool = False) -> None:
        # (a message that already asks, e.g. when unpickled from a Ray worker, is kept)
        suffix = "" if message.endswith(REPORT_REQUEST) else f"; {REPORT_REQUEST}"
        super().__init__(f"{message}{suffix}")
        self.onnxruntime_failed = onnxruntime_failed


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error message quotes of a library's failure."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's whole message on one line (whitespace runs joined), at most ``limit``
    characters; its type's name when it has none."""
    text = " ".join(str(exc).split())
    return text[:limit] if text else type(exc).__name__
