"""The recovery options: validated in QuantConfig, set by the quantize command's flags."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from onnxq.cli import main
from onnxq.config import QuantConfig
from onnxq.errors import ConfigError
from tests.recover.builders import conv_chain, image_batches


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("smoothquant", -0.1, "smoothquant: must be in [0, 1]"),
        ("smoothquant", 1.5, "smoothquant: must be in [0, 1]"),
        ("smoothquant_min_spread", 0.5, "smoothquant_min_spread: must be >= 1"),
        ("calibration_mode", "asym", "calibration_mode: unknown mode 'asym'; valid: float, prefix"),
        ("adaround_engine", "jax", "adaround_engine: unknown engine 'jax'; valid: numpy, torch"),
        ("adaround_steps", -1, "adaround_steps: must be >= 0"),
        ("adaround_rows", 0, "adaround_rows: must be >= 1"),
    ],
)
def test_invalid_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError) as info:
        QuantConfig(**{field: value})
    assert message in str(info.value)


def test_defaults_only_smoothquant_is_on_for_outlier_channels():
    cfg = QuantConfig()
    assert (cfg.cle, cfg.calibration_mode, cfg.adaround, cfg.bias_correction) == (
        False,
        "float",
        False,
        False,
    )
    assert (cfg.smoothquant, cfg.smoothquant_min_spread) == (0.8, 8.0)


@pytest.fixture
def files(tmp_path):
    m = conv_chain()
    model = tmp_path / "model.onnx"
    onnx.save(m, model)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(image_batches(m, n=4)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    return model, calib


def test_flags_set_the_fields_and_reach_the_report(files, tmp_path):
    model, calib = files
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "out.onnx"), "--calib", str(calib)]
    args += ["--report", str(report), "-q", "--cle", "--smoothquant", "--adaround"]
    args += [
        "--set",
        "recovery.adaround_steps=50",
        "--calibration-mode",
        "prefix",
        "--bias-correction",
    ]
    assert main(args) == 0
    data = json.loads(report.read_text())
    cfg = data["config"]
    assert (cfg["cle"], cfg["smoothquant"], cfg["calibration_mode"]) == (True, 0.8, "prefix")
    assert (cfg["adaround"], cfg["adaround_steps"], cfg["bias_correction"]) == (True, 50, True)
    assert set(data["recovery"]) == {"cle", "calibration", "adaround"}  # no MatMul to smooth


def test_a_bad_flag_value_is_a_user_error(files, tmp_path, capsys):
    model, calib = files
    out = tmp_path / "out.onnx"
    code = main(
        ["quantize", str(model), "-o", str(out), "--calib", str(calib), "--smoothquant", "2"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "smoothquant: must be in [0, 1]" in err and "Traceback" not in err
    assert not out.exists()


def test_the_terminal_summary_names_each_step(files, tmp_path, capsys):
    model, calib = files
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib)]
    assert main([*args, "--cle", "--adaround", "--set", "recovery.adaround_steps=20"]) == 0
    out = capsys.readouterr().out
    assert "recovery: CLE equalized 2 of 2 Conv pairs; AdaRound learned" in out


def test_no_smoothquant_turns_the_default_off(files, tmp_path):
    model, calib = files
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "out.onnx"), "--calib", str(calib)]
    assert main([*args, "--report", str(report), "-q", "--no-smoothquant"]) == 0
    assert json.loads(report.read_text())["config"]["smoothquant"] == 0.0
