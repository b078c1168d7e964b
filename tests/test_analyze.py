"""onnxq analyze: per-tensor error between a float model and its quantized version."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.analyze import analyze, write_analysis
from onnxq.cli import main
from onnxq.errors import CalibrationDataError
from tests import graphs


def test_identical_models_agree_everywhere():
    model = graphs.residual_add()
    layers = analyze(model, model, graphs.random_batches(model, 3))
    assert layers and all(x.cosine == pytest.approx(1.0) for x in layers)
    assert all(x.relative_error == pytest.approx(0.0, abs=1e-9) for x in layers)


def test_quantized_model_shows_error_where_qdq_was_placed():
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 4)
    quant = onnxq.quantize(model, batches, progress=False).model
    layers = analyze(model, quant, batches)
    by_op = {x.op_type for x in layers}
    assert "Conv" in by_op
    errors = [x.relative_error for x in layers]
    assert max(errors) > 0  # INT8 is not exact ...
    assert min(x.cosine for x in layers) > 0.99  # ... but close on a well-behaved model


def test_a_broken_scale_is_visible_at_its_layer():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 3)
    quant = onnxq.quantize(model, batches, progress=False).model
    for init in quant.graph.initializer:  # coarsen the input activation's scale 50x
        if init.name.endswith("_scale") and not init.dims:
            value = onnx.numpy_helper.to_array(init) * np.float32(50)
            init.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), init.name))
            break
    good = analyze(model, onnxq.quantize(model, batches, progress=False).model, batches)
    bad = analyze(model, quant, batches)
    assert min(x.cosine for x in bad) < min(x.cosine for x in good)


def test_no_batches_is_a_user_error():
    model = graphs.conv_relu()
    with pytest.raises(CalibrationDataError):
        analyze(model, model, [])


def test_cli_writes_report_and_lists_worst_tensors(tmp_path, calib_dir, capsys):
    model = graphs.residual_add()
    f = tmp_path / "f.onnx"
    q = tmp_path / "q.onnx"
    onnx.save(model, f)
    calib = calib_dir(model)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib), "-q"]) == 0
    report = tmp_path / "a.json"
    assert main(["analyze", str(f), str(q), "--calib", str(calib), "--report", str(report)]) == 0
    assert "least faithful" in capsys.readouterr().out
    layers = json.loads(report.read_text())["layers"]
    assert {"tensor", "producer", "op_type", "cosine", "relative_error"} <= set(layers[0])
    html_path = tmp_path / "a.html"
    write_analysis(html_path, analyze(model, model, graphs.random_batches(model, 1)))
    assert html_path.read_text().startswith("<!doctype html>")
