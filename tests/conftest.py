"""Shared fixtures: calibration folders and saved tiny models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests import graphs


@pytest.fixture
def calib_dir(tmp_path: Path) -> Callable[..., Path]:
    """Write ``n`` batches for a model's inputs as ``NNNN.npz`` files; returns the folder.

    ``calib_dir(model, n=4, seed=0, name="calib")``: the same arguments give the same files.
    """

    def write(model: onnx.ModelProto, n: int = 4, seed: int = 0, name: str = "calib") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for i, batch in enumerate(graphs.random_batches(model, n, seed)):
            np.savez(folder / f"{i:04d}.npz", **batch)
        return folder

    return write


@pytest.fixture
def model_file(tmp_path: Path) -> Callable[..., Path]:
    """Save a model under ``tmp_path``; returns its path."""

    def save(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        onnx.save(model, str(path))
        return path

    return save
