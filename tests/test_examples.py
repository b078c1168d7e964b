"""The README's first command and the bundled example, run the way a new user runs them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx

from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _accuracy(output: str, label: str) -> float:
    match = re.search(rf"^{re.escape(label)}\s+([0-9.]+)$", output, re.MULTILINE)
    assert match, f"no line {label!r} in:\n{output}"
    return float(match.group(1))


def test_readme_first_command_quantizes_the_example_and_keeps_its_accuracy(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert "onnxq quantize examples/digits/digits_cnn.onnx" in readme
    out = tmp_path / "digits_int8.onnx"
    report = tmp_path / "digits_int8.json"
    q = _run(
        "-m",
        "onnxq.cli",
        "quantize",
        str(EXAMPLE / "digits_cnn.onnx"),
        "-o",
        str(out),
        "--calib",
        str(EXAMPLE / "calib"),
        "--report",
        str(report),
        cwd=tmp_path,
    )
    assert q.returncode == 0, q.stderr
    assert out.is_file() and report.is_file()
    assert check(onnx.load(str(out)), PROFILES["tensorrt"]) == []
    ev = _run(str(EXAMPLE / "evaluate.py"), str(out), cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    float_acc = _accuracy(ev.stdout, "float accuracy")
    unfused = _accuracy(ev.stdout, "int8 accuracy (unfused)")
    assert float_acc > 0.95  # the example model is a real, trained classifier
    assert unfused >= float_acc - 0.01  # INT8 within one point of float on held-out digits


def test_example_calibration_and_evaluation_splits_do_not_overlap():
    import numpy as np

    calib = np.concatenate(
        [np.load(p, allow_pickle=False)["input"] for p in sorted((EXAMPLE / "calib").glob("*.npz"))]
    )
    evaluation = np.load(EXAMPLE / "eval.npz", allow_pickle=False)["input"]
    calib_rows = {row.tobytes() for row in calib}
    assert not any(row.tobytes() in calib_rows for row in evaluation)
