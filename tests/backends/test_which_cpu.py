"""``python -m onnxq.backends.which_cpu``: one line naming this machine's class, no warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onnxq.backends.cpu import CPU_CLASSES, ENV_VAR

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("forced", ["x86-avx2", "x86-vnni"])
def test_it_prints_the_class_and_where_it_came_from_without_a_warning(forced):
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_VAR: forced}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "onnxq.backends.which_cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"{forced} ({ENV_VAR}): {CPU_CLASSES[forced].description}\n"
