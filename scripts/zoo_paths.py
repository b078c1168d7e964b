"""Where the benchmark scripts find the zoo of ``../shared/zoo`` and what it made.

Every path can be moved with an environment variable, so the scripts run on any machine that
has the zoo somewhere:

* ``ZOO_DIR``: the zoo's checkout (``zoo.py``, ``data/``); default ``../shared/zoo`` beside
  this repository.
* ``ZOO_CACHE``: where the zoo's ``fetch.sh`` put the models (``models/NAME.onnx``); default
  ``~/.cache/onnxq-zoo``.
* ``ZOO_CALIB``: one folder of calibration batches per model (``NAME/0000.npz ...``, made by
  ``python zoo.py calib NAME $ZOO_CALIB/NAME --n 64``); default ``$ZOO_CACHE/calib``.
"""

from __future__ import annotations

import os
from pathlib import Path

ZOO = Path(os.environ.get("ZOO_DIR", Path(__file__).resolve().parents[2] / "shared" / "zoo"))
CACHE = Path(os.environ.get("ZOO_CACHE", Path.home() / ".cache" / "onnxq-zoo"))
MODELS = CACHE / "models"
CALIB = Path(os.environ.get("ZOO_CALIB", CACHE / "calib"))


def calibration_folder(model: str) -> Path:
    """The calibration batches of zoo model ``model``; exits with how to make them if absent."""
    folder = CALIB / model
    if not any(folder.glob("*.npz")):
        raise SystemExit(
            f"no calibration batches in {folder}: make them with "
            f"`python {ZOO / 'zoo.py'} calib {model} {folder} --n 64`, or set ZOO_CALIB"
        )
    return folder
