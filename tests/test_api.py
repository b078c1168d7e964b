"""The pipeline end to end: sources, configs, saving, determinism, fidelity."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.api import resolve_config
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.errors import CalibrationDataError, ConfigError, OutputError
from tests import graphs


def quantize(model: onnx.ModelProto, **options) -> onnxq.QuantizedModel:
    return onnxq.quantize(model, graphs.random_batches(model, 4), progress=False, **options)


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_quantize_twice_gives_identical_bytes_and_report(backend):
    first = quantize(graphs.residual_add(), backend=backend)
    second = quantize(graphs.residual_add(), backend=backend)
    assert ir.serialize(first.model) == ir.serialize(second.model)
    assert first.report.to_json() == second.report.to_json()


def test_quantize_from_files_is_deterministic(tmp_path, model_file, calib_dir):
    path = model_file(graphs.conv_bn_relu())
    folder = calib_dir(graphs.conv_bn_relu(), n=3)
    outs = []
    for name in ("a", "b"):
        result = onnxq.quantize(path, folder, progress=False)
        result.save(tmp_path / f"{name}.onnx", report=tmp_path / f"{name}.json")
        outs.append(
            (
                (tmp_path / f"{name}.onnx").read_bytes(),
                (tmp_path / f"{name}.json").read_text(encoding="utf-8"),
            )
        )
    assert outs[0] == outs[1]


def test_fidelity_is_measured_on_held_batches():
    result = quantize(graphs.conv_relu(), fidelity_batches=2)
    (fid,) = result.report.fidelity
    assert fid.name == "y" and 0.999 < fid.cosine <= 1.0
    assert 0 < fid.max_abs_error < 0.1 * fid.float_max_abs
    assert quantize(graphs.conv_relu(), fidelity_batches=0).report.fidelity == []


@pytest.mark.parametrize(
    "builder",
    [graphs.conv_bn_relu, graphs.conv_transpose_bn, lambda: graphs.gemm_bn(False)],
    ids=["conv_bn_relu", "conv_transpose_bn", "gemm_bn"],
)
def test_batchnorm_models_keep_their_accuracy(builder):
    # BN folding must keep the numbers: a wrong fold shows up as a low cosine, not an error
    result = quantize(builder())
    assert result.report.simplify_passes == ["fold_batchnorm"]
    assert "BatchNormalization" not in graphs.op_types(result.model)
    assert result.report.fidelity[0].cosine > 0.999


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_every_method_quantizes(method):
    result = quantize(graphs.residual_add(), method=method)
    assert {t.qparams.method for t in result.report.placed if t.kind == "activation"} == {method}
    assert result.report.fidelity[0].cosine > 0.98  # entropy clips hard on 4 small batches


def test_config_sources_and_keyword_precedence(tmp_path):
    yaml_path = tmp_path / "cfg.yaml"
    yaml_path.write_text("backend: onnxruntime\nmethod: mse\n", encoding="utf-8")
    assert resolve_config(yaml_path).backend == "onnxruntime"
    assert resolve_config({"method": "minmax"}).method == "minmax"
    cfg = resolve_config(str(yaml_path), method="entropy", exclude=None)
    assert (cfg.backend, cfg.method) == ("onnxruntime", "entropy")
    with pytest.raises(ConfigError, match="config must be a QuantConfig"):
        resolve_config(42)
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        quantize(graphs.conv_relu(), config={"colour": "blue"})


def test_exclude_and_no_simplify_options():
    result = quantize(graphs.identity_dropout(), exclude=["conv"], simplify=False)
    assert graphs.count_ops(result.model, "QuantizeLinear") == 0
    assert "Identity" in graphs.op_types(result.model)
    assert result.report.simplify_passes == []


def test_calibration_sources(tmp_path, calib_dir):
    model = graphs.conv_relu()
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.random.default_rng(0).standard_normal((5, 16, 8, 8)).astype(np.float32))
    by_samples = onnxq.quantize(model, samples, batch_size=1, progress=False)
    assert by_samples.report.calibration_batches == 5
    by_folder = onnxq.quantize(model, calib_dir(model, n=3), progress=False)
    assert by_folder.report.calibration_batches == 3
    by_mapping = onnxq.quantize(model, graphs.random_inputs(model), progress=False)
    assert by_mapping.report.calibration_batches == 1
    limited = onnxq.quantize(model, graphs.random_batches(model, 6), max_batches=2, progress=False)
    assert limited.report.calibration_batches == 2


def test_no_calibration_data_is_a_user_error():
    with pytest.raises(CalibrationDataError, match="no calibration data given"):
        onnxq.quantize(graphs.conv_relu(), None, progress=False)


def test_model_of_the_wrong_type_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model must be a path or an onnx\.ModelProto"):
        onnxq.quantize(123, [], progress=False)


def test_save_refuses_to_overwrite_the_input(model_file, calib_dir):
    path = model_file(graphs.conv_relu())
    before = path.read_bytes()
    result = onnxq.quantize(path, calib_dir(graphs.conv_relu()), progress=False)
    with pytest.raises(OutputError, match="is the input model"):
        result.save(path)
    assert path.read_bytes() == before


def test_save_writes_model_and_report(tmp_path):
    result = quantize(graphs.residual_add(), backend="onnxruntime")
    written = result.save(tmp_path / "q.onnx", report=tmp_path / "q.json")
    assert written == [tmp_path / "q.onnx", tmp_path / "q.json"]
    saved = ir.load_model(tmp_path / "q.onnx")
    assert check(saved, PROFILES["onnxruntime"]) == []
    assert json.loads((tmp_path / "q.json").read_text())["backend"] == "onnxruntime"


def test_nothing_to_quantize_still_gives_a_valid_model():
    result = quantize(graphs.matmul_act())
    assert graphs.op_types(result.model) == ["MatMul"]
    assert result.report.placed == [] and result.report.fidelity[0].cosine == 1.0


def test_constant_zero_activation_gives_a_warning():
    model = graphs.conv_relu()
    batches = [{"x": np.zeros((1, 16, 8, 8), np.float32)} for _ in range(2)]
    result = onnxq.quantize(model, batches, progress=False)
    assert any("constant zero" in w for w in result.report.warnings)
    assert check(result.model, PROFILES["tensorrt"]) == []


def test_concat_of_inputs_with_very_different_ranges_stays_float():
    model = graphs.two_branch_concat(channels=64)  # big enough for int8 to pay in onnxruntime
    for t in model.graph.initializer:  # the second branch: ~100x the first's range
        if t.name.startswith("c2."):
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * 100, t.name))
    batches = graphs.random_batches(model, 4)
    result = onnxq.quantize(model, batches, backend="onnxruntime", progress=False)
    concat = next(d for d in result.report.decisions if d.node == "concat")
    assert not concat.quantized
    assert "ranges differ" in concat.reason and "(> 16x)" in concat.reason
    same = onnxq.quantize(graphs.two_branch_concat(channels=64), batches, backend="onnxruntime",
                          progress=False)
    assert next(d for d in same.report.decisions if d.node == "concat").quantized
