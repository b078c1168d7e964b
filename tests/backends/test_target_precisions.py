"""A run's profile (``onnxq.backends.target.profile_for``): each backend's precisions, the fields
FP8 and --dynamic change, and the one-line refusals (before anything is loaded or written)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.backends.profile import ONNXRUNTIME, TENSORRT, BackendProfile
from onnxq.backends.target import tune_profile
from onnxq.cli import main
from onnxq.config import Override, QuantConfig
from onnxq.errors import ConfigError
from tests import graphs
from tests.numerics.test_precisions import FP8_MISSING


def run_profile(config: QuantConfig) -> BackendProfile:
    return config.backend_profile()[0]


def test_int8_keeps_the_backends_tuned_profile():
    # tensorrt computes what stays float in FP16 by default: FP16 Q/DQ scales need opset 19
    assert run_profile(QuantConfig()) == TENSORRT.replace(min_opset=19)
    assert run_profile(QuantConfig(high_precision="fp32")) == TENSORRT.replace(
        high_precision="fp32"
    )
    ort = QuantConfig(backend="onnxruntime", target_cpu="x86-vnni")
    assert run_profile(ort) == tune_profile(ONNXRUNTIME, ort.profile)[0]


def test_fp8_raises_the_opset_and_limits_the_convs():
    fp8 = run_profile(QuantConfig(precision="fp8"))
    assert (fp8.min_opset, fp8.min_conv_channels, fp8.max_conv_kernel_area) == (19, 16, 32)
    assert not fp8.compare_default_session and "ORT_ENABLE_BASIC" in fp8.validation_note
    # an int8 run with one FP8 override still needs opset 19 for that pair
    mixed = QuantConfig(overrides=(Override(node="conv", precision="fp8"),))
    assert mixed.placement.precisions() == ["int8", "fp8"]
    assert run_profile(mixed).min_opset == 19
    assert run_profile(mixed).min_conv_channels == 0  # the run stays int8


@pytest.mark.parametrize("cpu", ["x86-avx2", "x86-vnni"])
def test_dynamic_switches_to_the_dynamic_rules_on_the_tuned_profile(cpu):
    dyn = run_profile(QuantConfig(backend="onnxruntime", dynamic=True, target_cpu=cpu))
    assert dyn.dynamic and dyn.rule_set == "dynamic" and dyn.bias == "float"
    assert not dyn.quantize_outputs and dyn.min_channels == 64
    # the dynamic kernels multiply u8 x s8 like the static ones: 7-bit weights on AVX2
    assert dyn.target_cpu == cpu and dyn.weight_qmax == (63 if cpu == "x86-avx2" else 127)


@pytest.mark.parametrize(
    ("backend", "options", "message"),
    [
        ("onnxruntime", {"precision": "fp8"}, "precision fp8 with --backend onnxruntime: .*no FP8"),
        (
            "tensorrt",
            {"precision": "int16"},
            "precision int16 with --backend tensorrt: .*INT8, FP8",
        ),
        ("tensorrt", {"dynamic": True}, "--dynamic with --backend tensorrt: TensorRT has no"),
        ("onnxruntime", {"dynamic": True, "precision": "int16"}, "int8 only.*drop precision int16"),
        (
            "tensorrt",
            {"overrides": ({"op_type": "Conv", "precision": "int16"},)},
            "precision int16 with --backend tensorrt",
        ),
    ],
)
def test_a_backend_refuses_what_it_cannot_run(backend, options, message):
    with pytest.raises(ConfigError, match=message):
        run_profile(QuantConfig(backend=backend, **options))


def test_dynamic_refuses_bias_correction_before_loading_anything():
    with pytest.raises(ConfigError, match=r"bias_correction .* --dynamic"):
        onnxq.quantize("missing.onnx", backend="onnxruntime", dynamic=True, bias_correction=True)


@pytest.mark.parametrize(
    "args",
    [
        ["--backend", "onnxruntime", "--precision", "fp8"],
        ["--backend", "tensorrt", "--precision", "int16"],
        ["--backend", "tensorrt", "--dynamic"],
    ],
)
def test_the_cli_refuses_in_one_line_and_writes_nothing(
    tmp_path, model_file, calib_dir, capsys, args
):
    m = graphs.conv_relu(32, 32)
    out = tmp_path / "out.onnx"
    rc = main(["quantize", str(model_file(m)), "-o", str(out), "--calib", str(calib_dir(m)), *args])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.startswith("onnxq: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--save-calibration", "--load-calibration"])
def test_the_cli_refuses_dynamic_with_a_calibration_cache(
    tmp_path, model_file, calib_dir, capsys, flag
):
    m = graphs.conv_relu(32, 32)
    out, cache = tmp_path / "out.onnx", tmp_path / "cache.json"
    if flag == "--load-calibration":
        cache.write_text("{}")
    args = ["quantize", str(model_file(m)), "-o", str(out), "--calib", str(calib_dir(m))]
    rc = main([*args, "--backend", "onnxruntime", "--dynamic", flag, str(cache)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert (flag == "--load-calibration") == cache.exists()
    assert err.startswith("onnxq: error: --dynamic ") and err.count("\n") == 1


@pytest.mark.skipif(FP8_MISSING is not None, reason=FP8_MISSING or "")
def test_an_fp8_run_writes_opset_19_fp8_pairs_that_pass_the_check(tmp_path, model_file):
    m = graphs.residual_add(32)
    result = onnxq.quantize(m, graphs.random_batches(m, 8), precision="fp8")
    out = result.model
    assert onnxq.ir.opset_version(out) == 19
    zero_points = [
        onnx.numpy_helper.to_array(t) for t in out.graph.initializer if "zero_point" in t.name
    ]
    assert zero_points and all(z.dtype.name == "float8_e4m3fn" for z in zero_points)
    assert not any(np.asarray(z, np.float32).any() for z in zero_points)
    assert result.report.violations == []
    (fid,) = result.report.fidelity  # run unfused in onnxruntime: what TensorRT computes
    assert fid.cosine > 0.995
    assert result.report.summary().startswith("backend tensorrt (fp8): ")
    assert any("ORT_ENABLE_BASIC" in n for n in result.report.notes)  # onnxruntime 1.32's bug
    path = tmp_path / "fp8.onnx"
    result.save(path)
    assert main(["check", str(path), "--backend", "tensorrt"]) == 0


@pytest.mark.skipif(FP8_MISSING is not None, reason=FP8_MISSING or "")
def test_fp8_keeps_int8_placement_and_amax_ranges():
    m = graphs.residual_add(32)
    batches = graphs.random_batches(m, 8)
    int8 = onnxq.quantize(m, batches)
    fp8 = onnxq.quantize(m, batches, precision="fp8")
    assert [d.quantized for d in int8.report.decisions] == [
        d.quantized for d in fp8.report.decisions
    ]
    acts = [p for p in fp8.report.placed if p.kind == "activation"]
    assert acts and all(p.qparams.method == "minmax" and p.dtype == "float8e4m3fn" for p in acts)
    for p in acts:
        assert float(p.qparams.scale) == pytest.approx(p.qparams.high / 448, rel=1e-6)
