"""``onnxq quantize --weights ...`` and ``onnxq check`` on weight-only models."""

from __future__ import annotations

import onnx

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
