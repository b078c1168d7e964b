"""The accuracy target's search: reachable and unreachable targets, callbacks, the held-out
split, determinism, and the CLI's exit code."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.runs import run_outputs
from onnxq.cli import main
from onnxq.errors import CalibrationDataError, ConfigError
from onnxq.numerics.accuracy_target import AccuracyTarget, parse_target
from tests import graphs


def conv_chain(
    layers: int = 4, loud: int = 2, channels: int = 16, seed: int = 0
) -> onnx.ModelProto:
    """x -> (Conv 3x3 -> Relu) x ``layers``; the conv before layer ``loud`` gives one channel a
    bias of 200, so one per-tensor int8 scale crushes the other channels of conv ``loud``'s
    input: keeping conv ``loud`` float gains most."""
    r = graphs.rng(seed)
    nodes, inits, src = [], [], "x"
    for i in range(layers):
        bias = graphs.weight(r, channels)
        if i == loud - 1:
            bias[0] = 200.0
        nodes += [
            helper.make_node(
                "Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        inits += [
            graphs.init(f"w{i}", graphs.weight(r, channels, channels, 3, 3, scale=0.3)),
            graphs.init(f"b{i}", bias),
        ]
        src = f"r{i}"
    shape = [1, channels, 8, 8]
    return graphs.model(
        nodes, [graphs.tensor("x", shape)], [graphs.tensor(src, shape)], inits, name="conv_chain"
    )


def run(model, target, n=16, heldout=None, **options):
    if heldout is not None:  # the held-out data travels with the target
        target = dataclasses.replace(parse_target(target), heldout=heldout)
    return onnxq.quantize(
        model, graphs.random_batches(model, n), progress=False, target=target, **options
    )


def dequantized_inputs(model: onnx.ModelProto) -> set[str]:
    """Nodes (not Q/DQ) that read a DequantizeLinear output."""
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.name for n in model.graph.node if n.op_type not in ir.QDQ_OPS and set(n.input) & dq}


def test_reachable_target_keeps_the_harmful_layer_float():
    m = conv_chain()
    base = run(m, "cosine=0.0").report.mixed_precision
    ranking = base["sensitivity"]
    assert ranking[0]["node"] == "conv2" and base["kept_float"] == []
    alone = ranking[0]["score_float_alone"]
    threshold = (alone + base["int8_score"]) / 2
    result = run(m, f"cosine={threshold}")
    record = result.report.mixed_precision
    assert record["met"] and [k["node"] for k in record["kept_float"]] == ["conv2"]
    assert record["score"] >= threshold > record["int8_score"]
    assert "conv2" not in dequantized_inputs(result.model)
    assert {"conv0", "conv1", "conv3"} <= dequantized_inputs(result.model)
    (why,) = [d.reason for d in result.report.decisions if d.node == "conv2"]
    assert "accuracy target cosine >=" in why and "raises cosine by" in why
    assert not any("not met" in w for w in result.report.warnings)


def test_unreachable_target_returns_the_best_model_and_says_so():
    result = run(conv_chain(), "cosine=1.5")
    record = result.report.mixed_precision
    assert record["met"] is False
    assert record["score"] >= record["int8_score"]
    assert any("cosine >= 1.5 not met" in w for w in result.report.warnings)
    assert "NOT met" in result.report.summary(timing=False)


def test_met_by_all_int8_keeps_nothing_float():
    result = run(conv_chain(), "sqnr=0")
    record = result.report.mixed_precision
    assert record["met"] and record["kept_float"] == [] and record["float_macs"] == 0
    assert len(record["sensitivity"]) == 4 and record["trials"] == 5  # L + 1


def test_callback_metric_gets_the_held_out_outputs():
    seen = []

    def worst_error(reference, quantized):
        seen.append((len(reference), len(quantized), sorted(reference[0])))
        return -max(
            float(np.max(np.abs(r[k] - q[k])))
            for r, q in zip(reference, quantized, strict=True)
            for k in r
        )

    m = conv_chain()
    base = run(m, AccuracyTarget(worst_error, -1e9, name="neg_max_error"), n=16)
    assert seen and all(s == (4, 4, ["r3"]) for s in seen)  # 16 batches: a quarter held out
    record = base.report.mixed_precision
    assert record["target"] == "neg_max_error >= -1e+09" and record["kept_float"] == []
    goal = (record["sensitivity"][0]["score_float_alone"] + record["int8_score"]) / 2
    tight = run(m, AccuracyTarget(worst_error, goal, name="neg_max_error"))
    assert tight.report.mixed_precision["met"]
    assert tight.report.mixed_precision["kept_float"]


def test_callback_that_returns_no_number_is_a_config_error():
    with pytest.raises(ConfigError, match="must return a number"):
        run(conv_chain(), AccuracyTarget(lambda r, q: "good", 0.5, name="bad"))


def test_held_out_batches_are_not_calibrated_on():
    plain = onnxq.quantize(conv_chain(), graphs.random_batches(conv_chain(), 16), progress=False)
    searched = run(conv_chain(), "cosine=0", heldout_batches=3)
    assert plain.report.calibration_batches == 16
    assert searched.report.calibration_batches == 13
    assert "first 3 calibration batches" in searched.report.mixed_precision["heldout"]


def test_explicit_held_out_data_leaves_calibration_whole():
    m = conv_chain()
    result = run(m, "cosine=0", heldout=graphs.random_batches(m, 2, seed=7))
    assert result.report.calibration_batches == 16
    assert result.report.mixed_precision["heldout"] == "2 batches of the held-out data"


def test_too_few_batches_to_hold_out_says_what_to_do():
    with pytest.raises(CalibrationDataError, match="--heldout"):
        run(conv_chain(), "cosine=0.9", n=3)


def test_search_is_deterministic():
    m = conv_chain()
    first = run(m, "cosine=0.99999")
    second = run(m, "cosine=0.99999")
    assert ir.serialize(first.model) == ir.serialize(second.model)
    assert first.report.to_json() == second.report.to_json()


def test_calibrates_once_not_once_per_layer(monkeypatch):
    import onnxq.calibrate.measure as measure

    calls = []
    real = measure.calibrate
    monkeypatch.setattr(measure, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    record = run(conv_chain(layers=6), "cosine=0.99999").report.mixed_precision
    assert record["trials"] >= 7 and len(calls) == 1


def test_onnxruntime_backend_search_passes_its_check():
    from onnxq.backends.check import check
    from onnxq.backends.profile import PROFILES

    result = run(conv_chain(), "cosine=0.99999", backend="onnxruntime")
    assert result.report.mixed_precision["sensitivity"]
    assert check(result.model, PROFILES["onnxruntime"]) == []


def test_report_json_carries_the_record(tmp_path):
    result = run(conv_chain(), "cosine=0.99999")
    result.save(tmp_path / "q.onnx", report=tmp_path / "q.json")
    record = json.loads((tmp_path / "q.json").read_text())["mixed_precision"]
    assert {"target", "met", "kept_float", "float_macs_fraction", "sensitivity"} <= set(record)
    assert record["candidate_macs"] == 4 * (16 * 8 * 8) * (16 * 9)


def test_cli_target_missed_writes_the_model_and_exits_1(tmp_path, model_file, calib_dir, capsys):
    path = model_file(conv_chain())
    calib = calib_dir(conv_chain(), n=8)
    out = tmp_path / "q.onnx"
    code = main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q",
                 "--target", "cosine=1.5", "--set", "accuracy.heldout_batches=2"])  # fmt: skip
    assert code == 1 and out.exists()
    assert "not met" in capsys.readouterr().err


def test_cli_target_met_exits_0(tmp_path, model_file, calib_dir):
    path = model_file(conv_chain())
    calib = calib_dir(conv_chain(), n=8)
    out = tmp_path / "q.onnx"
    code = main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q",
                 "--target", "cosine=0.9"])  # fmt: skip
    assert code == 0 and out.exists()


def test_cli_bad_target_is_a_user_error(tmp_path, model_file, calib_dir, capsys):
    path = model_file(conv_chain())
    code = main(["quantize", str(path), "-o", str(tmp_path / "q.onnx"), "--calib",
                 str(calib_dir(conv_chain())), "--target", "psnr=3"])  # fmt: skip
    assert code == 2 and "unknown metric 'psnr'" in capsys.readouterr().err


def test_analyze_sensitivity_prints_the_ranking(tmp_path, model_file, calib_dir, capsys):
    path = model_file(conv_chain())
    calib = calib_dir(conv_chain(), n=8)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    capsys.readouterr()
    code = main(["analyze", str(path), str(out), "--calib", str(calib), "--sensitivity"])
    text = capsys.readouterr().out
    assert code == 0
    ranking = text[text.index("sensitivity (tensorrt") :].splitlines()
    assert "conv2" in ranking[1] and len(ranking) == 5


def test_score_is_the_written_models_recovery_included():
    m = conv_chain()
    held = graphs.random_batches(m, 3, seed=7)
    reference = run_outputs(m, held, False, "float")

    def written_score(model: onnx.ModelProto) -> float:
        written = run_outputs(model, held, False, "quantized", ours=True)
        return AccuracyTarget("cosine", 0.0).evaluate(reference, written)

    first = run(m, "cosine=0.0", heldout=held)
    plain = first.report.mixed_precision
    # the score is the model as written: tensorrt's FP16 typing included
    assert plain["score"] == pytest.approx(written_score(first.model), abs=1e-6)
    # no recovery: the trial is the model, up to FP16's rounding
    assert plain["score"] == pytest.approx(plain["search_score"], abs=1e-5)
    result = run(m, "cosine=0.0", heldout=held, sequential_correction=True)
    record = result.report.mixed_precision
    assert record["score"] == pytest.approx(written_score(result.model), abs=1e-6)
    assert record["search_score"] == plain["search_score"]  # the trials run no recovery
    assert record["score"] != record["search_score"]


@pytest.mark.parametrize("cle", [False, True])
def test_analyze_sensitivity_ranks_the_graph_the_target_search_ranks(cle):
    """``analyze --sensitivity`` and ``quantize --target`` share the first half of the run
    (the float rewrites included): the same data gives the same held-out batches, all-INT8
    score and ranking."""
    from onnxq.config import QuantConfig
    from onnxq.mixed.search import sensitivity_ranking

    m = conv_chain()
    data = graphs.random_batches(m, 16)
    cfg = QuantConfig(target_accuracy="cosine=0.9999", heldout_batches=4, cle=cle, progress=False)
    held, base, ranking = sensitivity_ranking(m, data, cfg)
    record = onnxq.quantize(m, data, config=cfg).report.mixed_precision
    assert record is not None and len(held.batches) == 4
    assert base == pytest.approx(record["int8_score"], abs=1e-6)
    assert [s.to_dict() for s in ranking] == record["sensitivity"]
