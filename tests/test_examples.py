"""The README's first command and the bundled example, run the way a new user runs them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import onnx

from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits"


def _run(*args: str, cwd: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run a README step from ``cwd``, its output file names moved into ``out``."""
    moved = [str(out / a) if a.startswith("digits_int8") else a for a in args]
    return subprocess.run(
        [sys.executable, *moved], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _readme_command(start: str) -> str:
    readme = (ROOT / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith(start)]
    return line


def _row(output: str, label: str) -> list[str]:
    match = re.search(rf"^{re.escape(label)}\s+(.+)$", output, re.MULTILINE)
    assert match, f"no line {label!r} in:\n{output}"
    return match.group(1).split()


def test_readme_first_command_shows_what_int8_buys_on_the_example(tmp_path):
    steps = [s.strip() for s in _readme_command("pip install . && onnxq quantize").split("&&")]
    assert steps[0] == "pip install ."
    quantize, evaluate = shlex.split(steps[1]), shlex.split(steps[2])
    assert quantize[:3] == ["onnxq", "quantize", "examples/digits/digits_cnn.onnx"]
    assert evaluate[:2] == ["python", "examples/digits/evaluate.py"]
    q = _run("-m", "onnxq.cli", *quantize[1:], cwd=ROOT, out=tmp_path)
    assert q.returncode == 0, q.stderr
    out = tmp_path / "digits_int8.onnx"
    assert check(onnx.load(str(out)), PROFILES["onnxruntime"]) == []
    ev = _run(*evaluate[1:], "--runs", "3", cwd=ROOT, out=tmp_path)
    assert ev.returncode == 0, ev.stderr
    float_acc, int8_acc, _, unfused = _row(ev.stdout, "accuracy (360 held-out digits)")
    assert float(float_acc) > 0.98  # the example model is a real, trained classifier
    assert float(int8_acc) >= float(float_acc) - 0.01  # INT8 within one point of float
    assert float(unfused) >= float(float_acc) - 0.01
    size = _row(ev.stdout, "file size")
    assert float(size[4].rstrip("x")) > 3.5  # int8 weights: about 4x smaller
    # nearly every conv/gemm is INT8: all but the one-channel stem and the ten-logit head
    assert _row(ev.stdout, "Conv/Gemm/MatMul in INT8") == ["-", "6", "of", "8"]
    assert "ms" in _row(ev.stdout, "latency, 1 image, 1 thread")


def test_readme_second_command_is_what_ci_runs():
    command = _readme_command('pip install -e ".[dev]"')
    assert command == 'pip install -e ".[dev]" && python -m pytest -q'
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_example_calibration_and_evaluation_splits_do_not_overlap():
    import numpy as np

    calib = np.concatenate(
        [np.load(p, allow_pickle=False)["input"] for p in sorted((EXAMPLE / "calib").glob("*.npz"))]
    )
    evaluation = np.load(EXAMPLE / "eval.npz", allow_pickle=False)["input"]
    calib_rows = {row.tobytes() for row in calib}
    assert not any(row.tobytes() in calib_rows for row in evaluation)
