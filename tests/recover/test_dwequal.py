"""Depthwise activation equalization: exact in float for homogeneous activations (and for a
Clip on the calibration data), channel ranges evened out, per-channel integer weights
unchanged, and the quantized model better where channel ranges are far apart."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from onnxq.data.inputs import model_inputs
from onnxq.errors import ConfigError
from onnxq.recover.dwequal import channel_scales, equalize_depthwise
from tests.recover.builders import conv_act_conv, conv_chain, image_batches

CHANNELS = 16


def run(m: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, b)[0] for b in batches])


def equalized(m: onnx.ModelProto, batches, max_scale: float = 4.0):
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    inputs = model_inputs(ir.Graph(copy))
    return equalize_depthwise(copy, batches, inputs, max_scale=max_scale, progress=False)


def initializer(m: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == name))


@pytest.mark.parametrize("activation", ["Relu", None, "LeakyRelu", "PRelu"])
def test_homogeneous_pairs_are_exact_and_the_ranges_even_out(activation):
    m = conv_act_conv(activation, second_groups=CHANNELS)
    batches = image_batches(m)
    out, pairs = equalized(m, batches, max_scale=1e3)
    (pair,) = pairs
    assert (pair.first, pair.second) == ("conv1", "conv2")
    assert pair.spread_before > 20 and pair.spread_after < pair.spread_before / 10
    assert not np.allclose(initializer(out, "conv1.weight"), initializer(m, "conv1.weight"))
    fresh = image_batches(m, n=3, seed=5, scale=3.0)  # data the peaks were not measured on
    ref, got = run(m, fresh), run(out, fresh)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_relu6_pair_is_exact_on_the_calibration_data():
    m = conv_act_conv("Clip", second_groups=CHANNELS)
    batches = image_batches(m)
    out, pairs = equalized(m, batches)
    (pair,) = pairs
    assert pair.activation == "Clip" and 1.0 < pair.largest_scale <= 4.0
    ref, got = run(m, batches), run(out, batches)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_scales_only_go_up_and_stop_at_the_bound():
    scale = channel_scales(np.array([4.0, 2.0, 0.5, 0.0, 0.01]), max_scale=4.0)
    assert scale.tolist() == [1.0, 2.0, 4.0, 1.0, 4.0]


@pytest.mark.parametrize("groups", [1, 4])
def test_a_second_conv_that_is_not_depthwise_is_left_alone(groups):
    m = conv_act_conv("Relu", second_groups=groups)
    out, pairs = equalized(m, image_batches(m))
    assert pairs == [] and out.SerializeToString() == m.SerializeToString()


def test_an_activation_read_elsewhere_is_left_alone():
    m = conv_act_conv("Relu", second_groups=CHANNELS)
    m.graph.output.append(onnx.helper.make_tensor_value_info("act_out", 1, [1, CHANNELS, 10, 10]))
    _, pairs = equalized(m, image_batches(m))
    assert pairs == []


def integer_weights(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {
        t.name: numpy_helper.to_array(t).astype(np.int32)
        for t in m.graph.initializer
        if t.name.endswith("_quantized")
    }


def test_quantized_weights_stay_the_same_and_the_activation_error_drops():
    m = conv_act_conv("Relu", second_groups=CHANNELS)
    batches = image_batches(m)
    common = {"backend": "tensorrt", "progress": False, "weak_channel_fraction": 1.0}
    plain = onnxq.quantize(m, batches, **common)  # conv2 in INT8 despite its weak channels
    done = onnxq.quantize(m, batches, dw_equalization=8.0, **common)
    a, b = integer_weights(plain.model), integer_weights(done.model)
    assert list(a) == list(b) == ["conv2.weight_quantized"]  # conv1 is too small for INT8
    for name in a:  # float rounding of the scaled weights may move a value by one step
        assert np.abs(a[name] - b[name]).max() <= 1 and (a[name] != b[name]).mean() < 0.01
    fresh = image_batches(m, n=4, seed=7)
    ref = run(m, fresh)
    err_plain = np.abs(run(plain.model, fresh) - ref).mean()
    err_done = np.abs(run(done.model, fresh) - ref).mean()
    assert err_done < 0.7 * err_plain
    section = done.report.to_dict()["recovery"]["dw_equalization"]
    assert section["max_scale"] == 8.0 and [p["second"] for p in section["pairs"]] == ["conv2"]
    assert check(done.model, PROFILES["tensorrt"]) == []


def test_the_output_is_byte_identical_run_to_run():
    m = conv_act_conv("Clip", second_groups=CHANNELS)
    runs = [
        onnxq.quantize(m, image_batches(m), backend="tensorrt", dw_equalization=4.0, progress=False)
        for _ in range(2)
    ]
    assert runs[0].model.SerializeToString() == runs[1].model.SerializeToString()


def test_a_scale_bound_below_one_is_refused():
    m = conv_act_conv("Relu", second_groups=CHANNELS)
    with pytest.raises(ConfigError, match="dw_equalization"):
        onnxq.quantize(m, image_batches(m), backend="tensorrt", dw_equalization=0.5)


def test_weak_channels_no_longer_keep_the_depthwise_conv_float():
    m = conv_act_conv("Relu", second_groups=CHANNELS)
    batches = image_batches(m)
    plain = onnxq.quantize(m, batches, backend="tensorrt", progress=False)
    done = onnxq.quantize(m, batches, backend="tensorrt", dw_equalization=8.0, progress=False)
    float_ops = [[op["node"] for op in r.report.to_dict()["float_ops"]] for r in (plain, done)]
    assert "conv2" in float_ops[0] and "conv2" not in float_ops[1]


def test_a_calibration_cache_skips_it_with_a_warning(tmp_path):
    m = conv_act_conv("Relu", second_groups=CHANNELS)
    cache = tmp_path / "stats.json"
    options = {"backend": "tensorrt", "dw_equalization": 4.0, "progress": False}
    saved = onnxq.quantize(m, image_batches(m), save_calibration=cache, **options)
    report = saved.report
    assert "dw_equalization" not in report.to_dict().get("recovery", {})
    assert any(
        w.startswith("depthwise equalization skipped: a calibration") for w in report.warnings
    )


def test_the_bare_flag_takes_the_default_bound_and_the_summary_names_it(tmp_path, capsys):
    m = conv_chain()  # conv1 -> relu -> conv2 -> relu -> depthwise conv3
    model, calib, report = tmp_path / "m.onnx", tmp_path / "calib", tmp_path / "r.json"
    onnx.save(m, model)
    calib.mkdir()
    for i, batch in enumerate(image_batches(m, n=4)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    args = ["quantize", str(model), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib)]
    assert main([*args, "--report", str(report), "--dw-equalization"]) == 0
    assert "recovery: depthwise equalization of 1 activations" in capsys.readouterr().out
    written = json.loads(report.read_text())
    assert written["config"]["dw_equalization"] == 4.0
    assert [p["second"] for p in written["recovery"]["dw_equalization"]["pairs"]] == ["conv3"]
