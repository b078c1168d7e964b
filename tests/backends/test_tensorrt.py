"""TensorRT engine build: runs only where the tensorrt package and an NVIDIA GPU exist."""

from __future__ import annotations

import pytest

import onnxq
from onnxq.backends.tensorrt import build_engine, tensorrt_available
from onnxq.cli import main
from onnxq.errors import ConfigError
from tests import graphs

REASON = tensorrt_available()


@pytest.mark.skipif(REASON is not None, reason=f"TensorRT engine build impossible here: {REASON}")
def test_engine_builds_with_int8_layers(tmp_path):
    model = graphs.residual_add()
    path = tmp_path / "q.onnx"
    onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).save(path)
    report = build_engine(path)
    assert report.layers and report.precisions.get("INT8", 0) > 0


@pytest.mark.skipif(REASON is None, reason="TensorRT is available: the refusal path cannot run")
def test_without_tensorrt_the_engine_check_says_what_is_missing(tmp_path, capsys):
    model = graphs.conv_relu()
    path = tmp_path / "q.onnx"
    onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).save(path)
    with pytest.raises(ConfigError, match="cannot build a TensorRT engine"):
        build_engine(path)
    assert main(["check", str(path), "--engine"]) == 2  # the static check still ran first
    captured = capsys.readouterr()
    assert "0 tensorrt violation(s)" in captured.out
    assert "tensorrt" in captured.err.lower()
