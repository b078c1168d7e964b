"""``--dynamic`` end to end: no calibration needed, fidelity when data is given, the CLI's
quantize, inspect, check and explain."""

from __future__ import annotations

import json

import pytest

import onnxq
from onnxq.cli import main
from onnxq.errors import ConfigError
from tests import graphs


def test_no_calibration_data_is_needed_and_none_is_measured():
    result = onnxq.quantize(graphs.matmul_stack(), backend="onnxruntime", dynamic=True)
    assert result.report.calibration_batches == 0 and result.report.fidelity == []
    assert any("fidelity not measured" in n for n in result.report.notes)
    assert any(n.startswith("dynamic quantization:") for n in result.report.notes)
    assert "activations at run time" in result.report.summary().splitlines()[0]


def test_calibration_data_only_feeds_the_fidelity_check():
    m = graphs.matmul_stack()
    result = onnxq.quantize(m, graphs.random_batches(m, 6), backend="onnxruntime", dynamic=True)
    fidelity = {f.name: f.cosine for f in result.report.fidelity}
    assert fidelity["y"] > 0.999 and fidelity["scores"] == pytest.approx(1.0)
    assert "dynamic int8 kernels" in result.report.fidelity_mode
    assert result.report.calibration_batches == 0


def test_calibration_statistics_are_refused():
    with pytest.raises(ConfigError, match=r"--dynamic .* no calibration statistics"):
        onnxq.quantize(
            graphs.matmul_stack(), backend="onnxruntime", dynamic=True, load_calibration="x.json"
        )


def test_the_cli_quantizes_inspects_checks_and_explains(tmp_path, model_file, capsys):
    src = model_file(graphs.recurrent("LSTM"))
    out, report = tmp_path / "dyn.onnx", tmp_path / "dyn.json"
    args = ["quantize", str(src), "-o", str(out), "--backend", "onnxruntime", "--dynamic"]
    assert main([*args, "--report", str(report), "-q"]) == 0
    assert json.loads(report.read_text())["config"]["dynamic"] is True
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "activation*" in text and "quantized at run time" in text
    assert main(["check", str(out), "--backend", "onnxruntime"]) == 0
    assert main(["check", str(out), "--backend", "tensorrt"]) == 1  # dynamic kernels forbidden
    capsys.readouterr()
    assert main(["explain", str(src), "--backend", "onnxruntime", "--dynamic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("rnn ") and "quantized by dynamic_lstm" in line for line in lines)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--adaround"], "adaround"),
        (["--calibration-mode", "prefix"], "calibration_mode"),
        (["--range-search"], "range_search"),
        (["--sequential-correction"], "sequential_correction"),
        (["--shift-activations"], "shift_activations"),
        (["--method", "minmax"], "method"),
    ],
)
def test_a_static_option_with_dynamic_is_refused_in_one_line(
    tmp_path, model_file, capsys, flags, named
):
    src = model_file(graphs.matmul_stack())
    out = tmp_path / "dyn.onnx"
    args = ["quantize", str(src), "-o", str(out), "--backend", "onnxruntime", "--dynamic"]
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()
    assert f"{named} applies to static quantization" in err and "drop --dynamic" in err


def test_the_api_refuses_what_a_dynamic_run_would_ignore():
    with pytest.raises(ConfigError, match=r"^adaround applies to static quantization"):
        onnxq.quantize(graphs.matmul_stack(), backend="onnxruntime", dynamic=True, adaround=True)


def test_a_weight_only_field_without_weights_is_refused(tmp_path, model_file, capsys):
    src = model_file(graphs.matmul_stack())
    args = ["quantize", str(src), "-o", str(tmp_path / "o.onnx"), "--block-size", "32"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "block_size applies to weight-only quantization" in err
