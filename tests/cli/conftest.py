"""Fixtures of the command-line tests: main()'s SIGTERM handler undone, a small model and its
calibration folder."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests import graphs


@pytest.fixture(autouse=True)
def keep_sigterm_handler():
    """main() installs a SIGTERM handler; give pytest its own back."""
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


@pytest.fixture
def conv_files(model_file, calib_dir) -> tuple[Path, Path]:
    model = graphs.conv_relu()
    return model_file(model), calib_dir(model, n=3)
