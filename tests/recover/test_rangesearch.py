"""Output-driven range search: each activation's range chosen by the model's output error,
one tensor at a time, kept only when the error on the judging batches drops."""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli.recovery import add_recovery_flags, recovery_options
from onnxq.data.inputs import model_inputs
from onnxq.recover.outputs import OutputDrift
from onnxq.recover.rangesearch import FACTORS, significantly_lower
from tests.recover.builders import conv_chain, image_batches

SETTINGS = {"progress": False, "min_channels": 0, "fidelity_batches": 2}


def test_a_gain_within_the_batch_to_batch_noise_is_not_significant():
    old = np.array([1.0, 1.0, 1.0, 1.0])
    assert significantly_lower(old - 0.1, old)
    assert not significantly_lower(old + np.array([-0.5, 0.4, -0.4, 0.3]), old)
    assert not significantly_lower(old, old)
    assert significantly_lower(np.array([0.5]), np.array([1.0]))


def test_quantize_with_range_search_reports_each_tensor_and_never_judges_worse():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=8)
    plain = onnxq.quantize(m, data, backend="tensorrt", **SETTINGS)
    searched = onnxq.quantize(m, data, backend="tensorrt", range_search=True, **SETTINGS)
    section = searched.report.recovery["range_search"]
    assert [t["tensor"] for t in section["tensors"]] == ["x", "r1", "r2"]
    assert section["changed"] == sum(t["kept"] for t in section["tensors"])
    for entry in section["tensors"]:
        before, after = entry["error_fit"]
        assert after <= before
        if entry["kept"]:
            assert entry["error_judge"][1] < entry["error_judge"][0]
            assert entry["candidate"] != "x1"
    assert check(searched.model, PROFILES["tensorrt"]) == []
    shaped = ir.infer_shapes(m)
    judge = OutputDrift(shaped, data, model_inputs(ir.Graph(shaped)), None, 2**30, every=(2, 1))
    assert judge(searched.model) <= judge(plain.model) + 1e-12
    again = onnxq.quantize(m, data, backend="tensorrt", range_search=True, **SETTINGS)
    assert again.model.SerializeToString() == searched.model.SerializeToString()


def test_a_source_read_once_skips_it_with_a_warning():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=4)
    out = onnxq.quantize(m, iter(data), backend="tensorrt", range_search=True, **SETTINGS)
    assert "range_search" not in out.report.recovery
    assert any("range search skipped" in w for w in out.report.warnings)


def test_the_cli_flag_sets_the_config_field():
    parser = argparse.ArgumentParser()
    add_recovery_flags(parser, parser)
    assert recovery_options(parser.parse_args(["--range-search"]))["range_search"] is True
    assert recovery_options(parser.parse_args([]))["range_search"] is None


def test_one_calibration_batch_skips_it_with_a_warning():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=1)
    out = onnxq.quantize(m, data, backend="tensorrt", range_search=True, **SETTINGS)
    assert "range_search" not in out.report.recovery
    assert any("at least two calibration batches" in w for w in out.report.warnings)


def test_the_cli_runs_it_and_the_summary_and_report_say_what_it_changed(tmp_path, capsys):
    from onnxq.cli import main

    m = conv_chain()
    model_path, calib = tmp_path / "model.onnx", tmp_path / "calib"
    onnx.save(m, model_path)
    calib.mkdir()
    for i, batch in enumerate(image_batches(m, n=6)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    report = tmp_path / "r.json"
    args = ["quantize", str(model_path), "-o", str(tmp_path / "o.onnx"), "--calib", str(calib)]
    args += ["--report", str(report), "--range-search", "--set", "recovery.range_search_batches=4"]
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert (data["config"]["range_search"], data["config"]["range_search_batches"]) == (True, 4)
    section = data["recovery"]["range_search"]
    assert section["factors"] == list(FACTORS)
    changed = f"range search changed {section['changed']} of {len(section['tensors'])} ranges"
    assert changed in capsys.readouterr().out
