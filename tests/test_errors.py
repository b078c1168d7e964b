"""The error family: user errors share a base, internal errors do not."""

from __future__ import annotations

import pytest

import onnxq
from onnxq.errors import (
    AccuracyError,
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    InternalError,
    ModelLoadError,
    OnnxqError,
    OutputError,
    UnsupportedModelError,
    Violation,
    first_line,
    one_line,
)


@pytest.mark.parametrize(
    "cls",
    [
        ModelLoadError,
        UnsupportedModelError,
        ConfigError,
        CalibrationDataError,
        AccuracyError,
        OutputError,
        BackendConstraintError,
    ],
)
def test_user_errors_are_onnxq_errors(cls):
    assert issubclass(cls, OnnxqError)


def test_internal_error_is_not_a_user_error():
    assert not issubclass(InternalError, OnnxqError)
    assert issubclass(InternalError, Exception)


def test_backend_constraint_error_carries_its_violations():
    v = Violation("n", "axis", "0", "1")
    err = BackendConstraintError("broken", [v])
    assert err.violations == (v,) and str(err) == "broken"
    assert BackendConstraintError("x").violations == ()


def test_package_exports():
    for name in onnxq.__all__:
        assert hasattr(onnxq, name)
    assert onnxq.quantize is onnxq.api.quantize


def test_first_line_and_one_line_quote_a_library_failure_on_one_line():
    failure = ValueError("bad node\n  at  input 3\n")
    assert first_line(failure) == "bad node"
    assert one_line(failure) == "bad node at input 3"
    assert one_line(ValueError("x" * 500), limit=10) == "x" * 10
    assert first_line(KeyError()) == one_line(KeyError()) == "KeyError"
