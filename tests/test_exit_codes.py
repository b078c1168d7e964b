"""Every public error and the exit code the CLI gives it: 1 a result that falls short (an
accuracy target, violations), 2 a user error, 3 a bug in onnxq, 130 an interrupt."""

from __future__ import annotations

import inspect
import signal

import pytest

import onnxq.errors
from onnxq.cli import EXIT_CODES, main
from onnxq.errors import (
    AccuracyError,
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    InternalError,
    ModelLoadError,
    OnnxqError,
    OutputError,
    ResourceError,
    UnsupportedModelError,
    Violation,
)
from tests import graphs

# every exception class in onnxq.errors, raised by the pipeline, and the CLI's exit code
EXPECTED: list[tuple[BaseException, int]] = [
    (OnnxqError("base"), 2),
    (ModelLoadError("unreadable"), 2),
    (UnsupportedModelError("no such op"), 2),
    (ConfigError("bad option"), 2),
    (CalibrationDataError("wrong shape"), 2),
    (OutputError("no folder"), 2),
    (ResourceError("no CUDA device"), 2),
    (BackendConstraintError("refused"), 2),
    (BackendConstraintError("violations", [Violation("n", "zero point", "0", "3")]), 1),
    (AccuracyError("top-1 71.2% < target 75%"), 1),
    (InternalError("a pass crashed"), 3),
    (KeyError("a bug without a class of its own"), 3),
    (KeyboardInterrupt(), 130),
]


@pytest.fixture(autouse=True)
def keep_sigterm_handler():
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


def test_every_error_class_of_onnxq_errors_is_listed():
    classes = {
        cls
        for _, cls in inspect.getmembers(onnxq.errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == "onnxq.errors"
    }
    assert classes == {type(e) for e, _ in EXPECTED} - {KeyError, KeyboardInterrupt}
    assert {kind for kind, _ in EXIT_CODES} >= {OnnxqError, InternalError, AccuracyError}


@pytest.mark.parametrize(("error", "code"), EXPECTED, ids=lambda x: type(x).__name__)
def test_the_cli_exits_with_the_errors_code(tmp_path, model_file, capsys, monkeypatch, error, code):
    def quantize(*_args, **_kwargs):
        raise error

    monkeypatch.setattr("onnxq.api.quantize", quantize)
    model = model_file(graphs.conv_relu())
    out = tmp_path / "out.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--calib", str(tmp_path)]) == code
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    if isinstance(error, OnnxqError):
        assert last == f"onnxq: error: {error}" and "Traceback" not in err
    elif isinstance(error, KeyboardInterrupt):
        assert last == "onnxq: interrupted; nothing was written"
    else:  # a bug: the traceback for the report, then one line asking for it
        assert last.startswith("onnxq: internal error: ") and "Traceback" in err
        assert "this is a bug in onnxq" in last and "please report it" in last
    assert not out.exists()


def test_an_internal_error_asks_for_a_report_naming_what_to_send():
    text = str(InternalError("simplify pass fold_pad crashed on node 'pad3'"))
    assert text.startswith("simplify pass fold_pad crashed on node 'pad3'; this is a bug in onnxq")
    assert "the model" in text and "the command" in text
    assert not issubclass(InternalError, OnnxqError)


def test_real_user_errors_exit_2(tmp_path, capsys):
    out = str(tmp_path / "o.onnx")
    missing = str(tmp_path / "missing.onnx")
    assert main(["quantize", missing, "-o", out, "--calib", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("onnxq: error: model file not found")
    assert main(["quantize", missing, "-o", out]) == 2
    assert capsys.readouterr().err.startswith("onnxq: error: no calibration data given")
