"""--save-calibration / --load-calibration: statistics reused without data, stale caches refused."""

from __future__ import annotations

import json

import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.cli import main
from onnxq.errors import CalibrationDataError
from tests import graphs


def test_cached_statistics_give_the_same_model_as_the_data(tmp_path):
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 4)
    cache = tmp_path / "calib.json"
    direct = onnxq.quantize(
        model, batches, method="percentile", progress=False, save_calibration=cache
    )
    assert json.loads(cache.read_text())["format"] == "onnxq-calibration"
    cached = onnxq.quantize(
        model, None, method="percentile", progress=False, load_calibration=cache
    )
    assert ir.serialize(cached.model) == ir.serialize(direct.model)
    # the report says where the statistics came from, and that no fidelity was measured
    assert cached.report.calibration_batches == 0
    assert "statistics from a calibration cache" in cached.report.summary().splitlines()[0]
    assert any(n.startswith("fidelity not measured") for n in cached.report.notes)


def test_a_failed_run_leaves_no_cache(tmp_path, monkeypatch):
    import onnxq.api

    def fail(*_args, **_kwargs):
        raise onnxq.errors.AccuracyError("validation failed")

    monkeypatch.setattr(onnxq.api, "verify", fail)
    model = graphs.residual_add()
    cache = tmp_path / "calib.json"
    with pytest.raises(onnxq.errors.AccuracyError):
        onnxq.quantize(
            model, graphs.random_batches(model, 2), progress=False, save_calibration=cache
        )
    assert not cache.exists()


def test_a_cache_serves_any_method_because_it_keeps_histograms(tmp_path):
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 4)
    cache = tmp_path / "calib.json"
    onnxq.quantize(model, batches, method="minmax", progress=False, save_calibration=cache)
    for method in ("entropy", "mse", "auto"):
        direct = onnxq.quantize(model, batches, method=method, progress=False)
        cached = onnxq.quantize(model, None, method=method, progress=False, load_calibration=cache)
        assert ir.serialize(cached.model) == ir.serialize(direct.model), method


def test_a_cache_of_another_model_names_the_missing_tensors(tmp_path):
    cache = tmp_path / "calib.json"
    other = graphs.conv_relu()
    onnxq.quantize(other, graphs.random_batches(other, 2), progress=False, save_calibration=cache)
    with pytest.raises(CalibrationDataError, match=r"no statistics for .* tensor"):
        onnxq.quantize(graphs.residual_add(), None, progress=False, load_calibration=cache)


def test_a_cache_of_another_backend_says_which_backend(tmp_path):
    # onnxruntime keeps a ConvTranspose float (no integer kernel): its cache holds nothing
    # that tensorrt, which quantizes it, needs
    model = graphs.with_tail(graphs.conv_transpose())
    cache = tmp_path / "calib.json"
    batches = graphs.random_batches(model, 2)
    onnxq.quantize(model, batches, backend="onnxruntime", progress=False, save_calibration=cache)
    assert json.loads(cache.read_text())["backend"] == "onnxruntime"
    with pytest.raises(CalibrationDataError, match="saved with --backend onnxruntime") as err:
        onnxq.quantize(model, None, backend="tensorrt", progress=False, load_calibration=cache)
    assert "--backend tensorrt quantizes other tensors" in str(err.value)


def test_a_tensorrt_cache_holds_what_onnxruntime_quantizes_too(tmp_path):
    """tensorrt's FP16 precision plan reads the peak of every float activation, so its cache
    holds them all: an onnxruntime run loads it and writes what calibrating gives."""
    model = graphs.residual_add()
    cache = tmp_path / "calib.json"
    batches = graphs.random_batches(model, 2)
    onnxq.quantize(model, batches, progress=False, save_calibration=cache)
    assert json.loads(cache.read_text())["backend"] == "tensorrt"
    loaded = onnxq.quantize(
        model, None, backend="onnxruntime", progress=False, load_calibration=cache
    )
    calibrated = onnxq.quantize(model, batches, backend="onnxruntime", progress=False)
    assert ir.serialize(loaded.model) == ir.serialize(calibrated.model)
    # without the plan (fp32) it observes only what it quantizes: onnxruntime quantizes more
    fp32 = tmp_path / "fp32.json"
    onnxq.quantize(model, batches, progress=False, save_calibration=fp32, high_precision="fp32")
    with pytest.raises(CalibrationDataError, match="saved with --backend tensorrt") as err:
        onnxq.quantize(model, None, backend="onnxruntime", progress=False, load_calibration=fp32)
    assert "--backend onnxruntime quantizes other tensors" in str(err.value)


def test_a_changed_shape_is_refused(tmp_path):
    cache = tmp_path / "calib.json"
    small = graphs.conv_relu(size=8)
    onnxq.quantize(small, graphs.random_batches(small, 2), progress=False, save_calibration=cache)
    with pytest.raises(CalibrationDataError, match=r"had shape .* now gives"):
        onnxq.quantize(graphs.conv_relu(size=16), None, progress=False, load_calibration=cache)


def test_cli_round_trip_and_garbage_cache(tmp_path, calib_dir, capsys):
    model = graphs.residual_add()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = calib_dir(model)
    cache = tmp_path / "c.json"
    assert (
        main(
            [
                "quantize",
                str(path),
                "-o",
                str(tmp_path / "a.onnx"),
                "--calib",
                str(calib),
                "--save-calibration",
                str(cache),
                "-q",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "quantize",
                str(path),
                "-o",
                str(tmp_path / "b.onnx"),
                "--load-calibration",
                str(cache),
                "-q",
            ]
        )
        == 0
    )
    (tmp_path / "bad.json").write_text("{not json")
    assert (
        main(
            [
                "quantize",
                str(path),
                "-o",
                str(tmp_path / "c.onnx"),
                "--load-calibration",
                str(tmp_path / "bad.json"),
            ]
        )
        == 2
    )
    assert "not a JSON calibration cache" in capsys.readouterr().err
    assert not (tmp_path / "c.onnx").exists()
