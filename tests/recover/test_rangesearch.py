"""Output-driven range search: each activation's range chosen by the model's output error,
one tensor at a time, kept only when the error on the judging batches drops."""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.calibration_session import make_session
from onnxq.config import QuantConfig
from onnxq.inputs import model_inputs
from onnxq.qparams import range_to_qparams
from onnxq.recover.flags import add_recovery_flags, recovery_options
from onnxq.recover.outputs import OutputError
from onnxq.recover.rangegrid import Candidate
from onnxq.recover.rangesearch import (
    FACTORS,
    FloatOutputs,
    SuffixRunner,
    fake_quantize,
    sample_errors,
    significantly_lower,
)
from tests.graphs import init, model, residual_add, tensor
from tests.recover.builders import conv_chain, image_batches

SETTINGS = {"progress": False, "min_channels": 0, "fidelity_batches": 2}


@pytest.mark.parametrize(("dtype", "symmetric"), [("int8", True), ("uint8", False)])
def test_fake_quantize_is_what_onnxruntime_computes(dtype, symmetric):
    qp = range_to_qparams(-1.3, 2.1, dtype, symmetric)
    x = np.random.default_rng(0).standard_normal((4, 257)).astype(np.float32) * 2
    x[0, :5] = np.array([0.5, 1.5, -0.5, 2.5, -2.5], np.float32) * qp.scale  # ties to even
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    m = model(
        nodes, [tensor("x", [4, 257])], [tensor("y", [4, 257])],
        [init("s", np.asarray(qp.scale, np.float32)), init("z", np.asarray(qp.zero_point))],
    )  # fmt: skip
    want = make_session(m, optimize=False).run(None, {"x": x})[0]
    np.testing.assert_array_equal(fake_quantize(x, qp), want)


def _quantized(m: onnx.ModelProto, data: list[dict[str, np.ndarray]]):
    out = onnxq.quantize(m, data, backend="tensorrt", **SETTINGS)
    return out.model


def two_conv_residual() -> onnx.ModelProto:
    """``x -> conv1 -> relu (r) -> conv2 -> relu (t) -> conv3; y = conv3 + r``: the skip ``r``
    crosses a cut after ``t``."""
    r = np.random.default_rng(0)
    ws = [init(f"w{i}", (r.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32)) for i in "123"]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r"], name="relu1"),
        helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["t"], name="relu2"),
        helper.make_node("Conv", ["t", "w3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "r"], ["y"], name="add"),
    ]
    return model(nodes, [tensor("x", [2, 8, 6, 6])], [tensor("y", [2, 8, 6, 6])], ws)


@pytest.mark.parametrize(
    ("build", "tensors", "crossing"),
    [(conv_chain, ("r1", "r2"), 1), (residual_add, ("skip",), 1), (two_conv_residual, ("t",), 2)],
)
def test_the_current_range_scores_what_the_whole_quantized_model_scores(build, tensors, crossing):
    m = ir.infer_shapes(build())
    data = image_batches(m, n=6)
    quantized = _quantized(m, data)
    inputs = model_inputs(ir.Graph(m))
    reference = FloatOutputs(m, data, inputs, _calibration(QuantConfig()))
    full, floating = make_session(quantized, optimize=False), make_session(m, optimize=False)
    per_sample = [
        sample_errors(full.run(None, batch)[0], floating.run(None, batch)[0]) for batch in data[::2]
    ]
    whole = float(np.concatenate(per_sample).mean())
    for tensor_name in tensors:
        runner = SuffixRunner.at(quantized, tensor_name)
        assert runner is not None
        # what else the rest reads from before the cut (a residual branch) comes from the
        # part before it, as that part computes it
        assert len(runner.cut.boundary) == crossing
        qp = _qparams_in(quantized, tensor_name)
        errors = runner.errors([Candidate("x1", 1.0, qp)], reference.batches(0))
        assert errors.shape == (1, 3)
        assert float(errors.mean()) == pytest.approx(whole, rel=1e-5)


def test_sample_errors_weigh_each_sample_alone():
    want = np.array([[1.0, 0.0], [10.0, 0.0]])
    got = np.array([[1.0, 1.0], [10.0, 1.0]])
    np.testing.assert_allclose(sample_errors(got, want), [1.0, 0.01])
    assert sample_errors(np.float64(3.0), np.float64(0.0)).tolist() == [9.0]


def test_a_gain_within_the_batch_to_batch_noise_is_not_significant():
    old = np.array([1.0, 1.0, 1.0, 1.0])
    assert significantly_lower(old - 0.1, old)
    assert not significantly_lower(old + np.array([-0.5, 0.4, -0.4, 0.3]), old)
    assert not significantly_lower(old, old)
    assert significantly_lower(np.array([0.5]), np.array([1.0]))


def _calibration(cfg: QuantConfig):
    from onnxq.options import CalibrationOptions, view

    return view(CalibrationOptions, cfg)


def _qparams_in(quantized: onnx.ModelProto, tensor_name: str):
    """The qparams of ``tensor_name``'s QuantizeLinear in ``quantized``."""
    graph = ir.Graph(quantized)
    node = next(
        n
        for n in quantized.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] == tensor_name
    )
    scale, zero = graph.const_value(node.input[1]), graph.const_value(node.input[2])
    assert scale is not None and zero is not None
    high = float(scale) * 127
    qp = range_to_qparams(-high, high, "int8", True)
    assert float(qp.scale) == float(scale) and int(qp.zero_point) == int(zero)
    return qp


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
    judge = OutputError(shaped, data, model_inputs(ir.Graph(shaped)), None, 2**30, every=(2, 1))
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
    add_recovery_flags(parser)
    assert recovery_options(parser.parse_args(["--range-search"]))["range_search"] is True
    assert recovery_options(parser.parse_args([]))["range_search"] is None


def test_one_calibration_batch_skips_it_with_a_warning():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=1)
    out = onnxq.quantize(m, data, backend="tensorrt", range_search=True, **SETTINGS)
    assert "range_search" not in out.report.recovery
    assert any("at least two calibration batches" in w for w in out.report.warnings)


def test_range_search_batches_caps_what_it_reads():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=8)
    cfg = QuantConfig(range_search_batches=4)
    inputs = model_inputs(ir.Graph(ir.infer_shapes(m)))
    reference = FloatOutputs(ir.infer_shapes(m), data, inputs, _calibration(cfg), 4)
    assert [i for i, _, _ in reference.batches(0)] == [0, 2]
    assert [i for i, _, _ in reference.batches(1)] == [1, 3]
    with pytest.raises(onnxq.errors.ConfigError):
        QuantConfig(range_search_batches=1)


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
    args += ["--report", str(report), "--range-search", "--range-search-batches", "4"]
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert (data["config"]["range_search"], data["config"]["range_search_batches"]) == (True, 4)
    section = data["recovery"]["range_search"]
    assert section["factors"] == list(FACTORS)
    changed = f"range search changed {section['changed']} of {len(section['tensors'])} ranges"
    assert changed in capsys.readouterr().out


def test_padded_positions_are_left_out_of_the_error():
    want = np.ones((1, 3, 2))
    got = want.copy()
    got[0, 2] = 50.0  # a padded position
    mask = np.array([[True, True, False]])
    assert sample_errors(got, want, mask).tolist() == [0.0]
    assert sample_errors(got, want)[0] > 100
    # an output the mask does not fit (a pooled embedding) is compared whole
    assert sample_errors(got[:, 0], want[:, 0], mask).tolist() == [0.0]
