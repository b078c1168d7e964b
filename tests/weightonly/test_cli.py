"""``onnxq quantize --weights ...`` and ``onnxq check`` on weight-only models."""

from __future__ import annotations

import onnx
import pytest

from onnxq.cli import main
from tests.weightonly import models


def test_quantize_int4_without_calibration_data_then_check(tmp_path, capsys):
    src = tmp_path / "lm.onnx"
    onnx.save(models.decoder(), str(src))
    out = tmp_path / "lm.int4.onnx"
    code = main(
        [
            "quantize",
            str(src),
            "-o",
            str(out),
            "--weights",
            "int4",
            "--backend",
            "onnxruntime",
            "--block-size",
            "32",
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0 and out.exists()
    text = capsys.readouterr().out
    assert "weight-only: 5 layers quantized" in text and "lm_head_proj: int8" in text
    assert main(["check", str(out), "--backend", "onnxruntime"]) == 0
    assert "5 weight-only ops" in capsys.readouterr().out
    assert main(["check", str(out), "--backend", "tensorrt"]) == 1  # MatMulNBits: not for TensorRT


def test_a_bad_block_size_is_one_line_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "lm.onnx"
    onnx.save(models.decoder(), str(src))
    out = tmp_path / "out.onnx"
    code = main(["quantize", str(src), "-o", str(out), "--weights", "int4", "--block-size", "32"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and "tensorrt runs weight blocks of 64 or 128 only" in err


def test_gptq_with_a_calibration_folder(tmp_path, capsys):
    import numpy as np

    src = tmp_path / "lm.onnx"
    onnx.save(models.decoder(hidden=128, ffn=256), str(src))
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(models.token_batches(3)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    out = tmp_path / "trt.onnx"
    assert (
        main(["quantize", str(src), "-o", str(out), "--weights", "int4", "--calib", str(calib)])
        == 0
    )
    assert "gptq" in capsys.readouterr().out
    assert main(["check", str(out), "--backend", "tensorrt"]) == 0


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--target", "cosine=0.99"], "target_accuracy"),
        (["--heldout", "held/"], "heldout"),
        (["--cle"], "cle"),
        (["--smoothquant", "0.5"], "smoothquant"),
        (["--adaround"], "adaround"),
        (["--calibration-mode", "prefix"], "calibration_mode"),
        (["--bias-correction"], "bias_correction"),
        (["--sequential-correction"], "sequential_correction"),
        (["--range-search"], "range_search"),
        (["--shift-activations"], "shift_activations"),
        (["--dw-equalization"], "dw_equalization"),
        (["--exclude-op-type", "Gather"], "exclude_op_types"),
    ],
)
def test_a_static_option_with_weights_is_refused_in_one_line(tmp_path, capsys, flags, named):
    src = tmp_path / "lm.onnx"
    onnx.save(models.decoder(), str(src))
    out = tmp_path / "out.onnx"
    code = main(["quantize", str(src), "-o", str(out), "--weights", "int4", *flags])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and "Traceback" not in err
    assert err.count("\n") == 1 and f"{named}: weight-only quantization" in err and "drop" in err


def test_dynamic_with_weights_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "lm.onnx"
    onnx.save(models.decoder(), str(src))
    args = ["quantize", str(src), "-o", str(tmp_path / "o.onnx"), "--weights", "int8"]
    assert main([*args, "--backend", "onnxruntime", "--dynamic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dynamic and weight_only are two kinds of run" in err
