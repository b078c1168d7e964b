"""Flags that moved: the numeric tunables now reached by ``--set`` alone, and ``--heldout``,
which is the data of an accuracy target and needs one."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from onnxq.cli import main
from onnxq.cli.flags import MOVED
from onnxq.config.sections import SECTIONS
from tests import graphs


def one_error_line(code: int, err: str) -> str:
    """The single stderr line of a user error (exit 2, no traceback)."""
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxq: error: ")
    return lines[0]


# ------------------------------------------------------------------------------- moved flags
def test_every_moved_flag_names_a_config_field():
    for flag, path in MOVED.items():
        section, _, name = path.partition(".")
        assert name in SECTIONS[section][1], (flag, path)
        assert flag == "--" + name.replace("_", "-")  # the old flag was the field's name


@pytest.mark.parametrize("flag", sorted(MOVED))
@pytest.mark.parametrize("form", ["separate", "joined", "no value"])
def test_a_moved_flag_says_where_it_went_in_one_line(tmp_path, conv_files, capsys, flag, form):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    given = {"separate": [flag, "7"], "joined": [f"{flag}=7"], "no value": [flag]}[form]
    code = main(["quantize", str(model), "-o", str(out), "--calib", str(calib), *given, "-q"])
    line = one_error_line(code, capsys.readouterr().err)
    value = "N" if form == "no value" else "7"
    assert line == (
        f"onnxq: error: {flag} moved: use --set {MOVED[flag]}={value} "
        "(onnxq quantize --help-all lists every field)"
    )
    assert not out.exists()


def test_a_moved_flag_from_the_console_script_is_one_line(tmp_path, conv_files):
    model, calib = conv_files
    done = subprocess.run(
        [sys.executable, "-m", "onnxq.cli", "quantize", str(model), "-o", "o.onnx",
         "--calib", str(calib), "--adaround-steps", "20"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    line = one_error_line(done.returncode, done.stderr)
    assert "--set recovery.adaround_steps=20" in line
    assert not (tmp_path / "o.onnx").exists()


def test_a_moved_flag_is_not_looked_for_in_other_commands(conv_files, capsys):
    model, calib = conv_files
    with pytest.raises(SystemExit) as info:  # analyze never had it: argparse's own error
        main(["analyze", str(model), str(model), "--calib", str(calib), "--heldout-batches", "2"])
    assert info.value.code == 2
    assert "unrecognized arguments: --heldout-batches" in capsys.readouterr().err


@pytest.mark.parametrize(
    "setting, field, value",
    [
        ("calibration.histogram_sample=0", "histogram_sample", 0),
        ("calibration.histogram_budget=0", "histogram_budget", 0),
        ("recovery.range_search_batches=2", "range_search_batches", 2),
    ],
)
def test_the_moved_fields_are_set_with_set(tmp_path, conv_files, setting, field, value):
    model, calib = conv_files
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib), "-q"]
    assert main([*args, "--set", setting, "--report", str(report)]) == 0
    assert json.loads(report.read_text())["config"][field] == value


def test_batch_size_can_come_from_set(tmp_path, model_file, capsys):
    # the flag has no default of its own: --set (or a config file) gives the batch size
    model = model_file(graphs.shape_subgraph())  # x: [N, 16, 64]
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.random.default_rng(0).normal(size=(4, 16, 64)).astype(np.float32))
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(samples)]
    assert main([*args, "-q", "--set", "calibration.batch_size=2", "--report", str(report)]) == 0
    assert json.loads(report.read_text())["summary"]["calibration_batches"] == 2
    capsys.readouterr()
    code = main([*args, "--batch-size", "1", "--set", "calibration.batch_size=2"])
    assert "a flag already sets batch_size to 1" in one_error_line(code, capsys.readouterr().err)


def test_a_cache_path_from_set_is_checked_like_the_flag(tmp_path, conv_files, capsys):
    model, calib = conv_files
    before = model.read_bytes()
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib)]
    code = main([*args, "--set", f"calibration.save_calibration={model}"])
    line = one_error_line(code, capsys.readouterr().err)
    assert "calibration cache to save" in line and "choose another path" in line
    assert model.read_bytes() == before


# ------------------------------------------------------------------------------- --heldout
def test_heldout_without_a_target_is_refused(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    args = ["quantize", str(model), "-o", str(out), "--calib", str(calib), "--heldout", str(calib)]
    line = one_error_line(main(args), capsys.readouterr().err)
    assert line == (
        "onnxq: error: --heldout DATA is the data --target is measured on: add --target "
        "METRIC=VALUE"
    )
    assert not out.exists()


@pytest.mark.parametrize("where", ["flag", "config"])
def test_heldout_with_a_target_measures_it_on_that_data(tmp_path, model_file, calib_dir, where):
    m = graphs.conv_relu()
    model, calib = model_file(m), calib_dir(m, n=3)
    held = calib_dir(m, n=2, seed=5, name="held")
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib), "-q",
            "--heldout", str(held), "--report", str(report)]  # fmt: skip
    if where == "flag":
        args += ["--target", "cosine=0"]
    else:
        config = tmp_path / "c.yaml"
        config.write_text("accuracy:\n  target_accuracy: cosine=0\n", encoding="utf-8")
        args += ["--config", str(config)]
    assert main(args) == 0
    written = json.loads(report.read_text())
    assert written["summary"]["calibration_batches"] == 3  # none held out of --calib
    assert written["mixed_precision"]["heldout"] == "2 batches of the held-out data"
    assert written["mixed_precision"]["met"] is True


def test_heldout_with_weights_is_refused_as_a_static_option(tmp_path, model_file, capsys):
    model = model_file(graphs.matmul_const(k=64, n=64))
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--weights", "int4"]
    line = one_error_line(main([*args, "--heldout", "held/"]), capsys.readouterr().err)
    assert "heldout: weight-only quantization (--weights int4) does not use it" in line


# ------------------------------------------------------------------------------- explain
def test_explain_refuses_a_weight_only_config_in_one_line(tmp_path, model_file, capsys):
    model = model_file(graphs.matmul_const(k=64, n=64))
    config = tmp_path / "w.yaml"
    config.write_text("weightonly:\n  weight_only: int4\n", encoding="utf-8")
    code = main(["explain", str(model), "--config", str(config), "--exclude-op-type", "Gather"])
    line = one_error_line(code, capsys.readouterr().err)
    assert "weight_only: int4: onnxq explain shows where the Q/DQ" in line
    assert "drop weight_only from the config" in line
