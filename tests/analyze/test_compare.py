"""onnxq analyze: per-tensor error between a float model and its quantized version."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.analyze.compare import analyze, write_analysis
from onnxq.cli import main
from onnxq.errors import CalibrationDataError, UnsupportedModelError
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


def test_a_model_with_other_shapes_under_the_same_names_is_refused():
    # same input, same tensor names, 16 against 32 channels: before, every tensor whose
    # shapes differed was skipped and showed as cosine 1.0
    model, other = graphs.conv_relu(out_channels=16), graphs.conv_relu(out_channels=32)
    with pytest.raises(
        UnsupportedModelError,
        match=r"tensor 'conv_out' has shape "
        r"\[1, 16, 8, 8\] in the float model but \[1, 32, 8, 8\] in the "
        r"quantized one \(batch 0\): the quantized model is not a quantization",
    ):
        analyze(model, other, graphs.random_batches(model, 2))


def test_a_model_with_other_inputs_or_no_shared_tensor_is_refused():
    model = graphs.conv_relu()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.input[0].name = "image"
    renamed.graph.node[0].input[0] = "image"
    with pytest.raises(
        UnsupportedModelError,
        match=r"inputs \[image \(float32\)\] are not the "
        r"float model's \[x \(float32\)\]",
    ):
        analyze(model, renamed, graphs.random_batches(model, 1))
    for node in renamed.graph.node:  # same inputs, every tensor named otherwise
        node.input[0] = "x" if node.input[0] == "image" else "other_" + node.input[0]
        node.output[0] = "other_" + node.output[0]
    renamed.graph.input[0].name = "x"
    renamed.graph.output[0].name = "other_y"
    with pytest.raises(
        UnsupportedModelError,
        match="no float tensor of the float model has a namesake in the quantized model",
    ):
        analyze(model, renamed, graphs.random_batches(model, 1))


def test_cli_says_when_the_models_do_not_belong_together(tmp_path, calib_dir, capsys):
    f, q = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(graphs.conv_relu(out_channels=16), f)
    onnx.save(graphs.conv_relu(out_channels=32), q)
    calib = calib_dir(graphs.conv_relu())
    assert main(["analyze", str(f), str(q), "--calib", str(calib)]) == 2
    err = capsys.readouterr().err
    assert "not a quantization of this float model" in err and "Traceback" not in err


def test_cli_writes_report_and_lists_worst_tensors(tmp_path, calib_dir, capsys):
    model = graphs.residual_add()
    f = tmp_path / "f.onnx"
    q = tmp_path / "q.onnx"
    onnx.save(model, f)
    calib = calib_dir(model)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib), "-q"]) == 0
    report = tmp_path / "a.json"
    assert main(["analyze", str(f), str(q), "--calib", str(calib), "--report", str(report)]) == 0
    assert "where the error jumps" in capsys.readouterr().out
    layers = json.loads(report.read_text())["layers"]
    assert {"tensor", "producer", "op_type", "cosine", "relative_error"} <= set(layers[0])
    html_path = tmp_path / "a.html"
    write_analysis(html_path, analyze(model, model, graphs.random_batches(model, 1)))
    assert html_path.read_text().startswith("<!doctype html>")


def _log_model(first_op: str) -> onnx.ModelProto:
    """x -> first_op -> Log (-inf at 0, NaN below) -> Add 1 -> y."""
    from onnx import helper

    attrs = {"alpha": 0.5} if first_op == "LeakyRelu" else {}
    nodes = [
        helper.make_node(first_op, ["x"], ["r"], name="act", **attrs),
        helper.make_node("Log", ["r"], ["l"], name="log"),
        helper.make_node("Add", ["l", "one"], ["y"], name="add"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [2, 8])],
        [graphs.tensor("y", [2, 8])],
        [graphs.init("one", np.ones(1, np.float32))],
    )


def test_non_finite_values_equal_in_both_models_agree_and_the_report_is_json(tmp_path):
    model = _log_model("Relu")
    batches = graphs.random_batches(model, 2)
    layers = analyze(model, model, batches)
    assert all(x.cosine == pytest.approx(1.0) and x.nonfinite_mismatches == 0 for x in layers)
    path = tmp_path / "a.json"
    write_analysis(path, layers)
    json.loads(path.read_text(encoding="utf-8"), parse_constant=pytest.fail)


def test_non_finite_values_in_one_model_only_are_counted_not_folded_into_nan():
    # the "quantized" model gives NaN (Log of a negative) where the float one gives -inf
    batches = graphs.random_batches(_log_model("Relu"), 2)
    layers = {x.tensor: x for x in analyze(_log_model("Relu"), _log_model("LeakyRelu"), batches)}
    negatives = sum(int((b["x"] < 0).sum()) for b in batches)
    assert negatives and layers["l"].nonfinite_mismatches == negatives
    assert all(np.isfinite(x.cosine) and np.isfinite(x.relative_error) for x in layers.values())


def test_random_draws_are_not_compared():
    from onnx import helper

    nodes = [
        helper.make_node("RandomNormalLike", ["x"], ["noise"], name="draw"),
        helper.make_node("Cast", ["noise"], ["noise32"], name="cast", to=1),
        helper.make_node("Mul", ["noise32", "scale"], ["scaled"], name="scale_it"),
        helper.make_node("Add", ["x", "scaled"], ["y"], name="add"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", [2, 8])],
        [graphs.tensor("y", [2, 8])],
        [graphs.init("scale", np.zeros(1, np.float32))],
    )
    layers = analyze(model, model, graphs.random_batches(model, 2))
    # the draw and what only it feeds are left out; y mixes x in (scale 0: equal runs)
    assert [x.tensor for x in layers] == ["y"] and layers[0].cosine == pytest.approx(1.0)


# ------------------------------------------------------------- local and accumulated error
def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10((ref * ref).sum() / ((ref - got) ** 2).sum())


def _run(model: onnx.ModelProto, outputs: list[str], batch: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outputs)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), opts)
    return session.run(outputs, batch)


def test_local_and_accumulated_error_match_onnxruntime_on_the_op_alone(tmp_path):
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 3)
    quant = onnxq.quantize(model, batches, progress=False).model
    layers = {x.tensor: x for x in analyze(model, quant, batches)}
    # oracle: the quantized model's Q/DQ -> conv2 alone, fed the float model's `skip`
    onnx.save(quant, tmp_path / "q.onnx")
    onnx.utils.extract_model(
        str(tmp_path / "q.onnx"), str(tmp_path / "alone.onnx"), ["skip"], ["conv2_out"]
    )
    alone = onnx.load(tmp_path / "alone.onnx")
    # tensorrt's default output computes in FP16: its Q/DQ reads `skip` in FP16, and the local
    # copy reads the float `skip` rounded to FP16, as here
    (held,) = alone.graph.input
    assert held.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    ref, skip, acc = [], [], []
    for b in batches:
        r, s = _run(model, ["conv2_out", "skip"], b)
        ref.append(r)
        skip.append(s.astype(np.float16))
        acc.append(_run(quant, ["conv2_out"], b)[0])
    local = [_run(alone, ["conv2_out"], {"skip": s})[0] for s in skip]
    conv2 = layers["conv2_out"]
    assert conv2.quantized and conv2.producer == "conv2"
    assert conv2.local_sqnr_db == pytest.approx(_sqnr(np.stack(ref), np.stack(local)), abs=0.01)
    assert conv2.sqnr_db == pytest.approx(_sqnr(np.stack(ref), np.stack(acc)), abs=0.01)
    # conv1 reads the graph input: nothing before it, so local and accumulated agree; conv2
    # inherits conv1's error, so its accumulated error is larger than its own
    assert layers["conv1_out"].local_sqnr_db == layers["conv1_out"].sqnr_db
    assert conv2.sqnr_db < conv2.local_sqnr_db
    assert conv2.weight_sqnr_db is not None and conv2.input_sqnr_db is not None
    assert not layers["skip"].quantized and layers["skip"].advice is None
    assert "--exclude 'conv2' keeps it float" in (conv2.advice or "")


def test_an_fp16_output_is_compared_as_its_fp32_twin_is():
    """tensorrt's default output computes in FP16 and writes its graph output ``y`` as
    ``y_fp16 -> Cast -> y``: every tensor is compared, ``y`` under its own op (the Add, not
    the Cast back), and the numbers are the FP32 output's up to FP16's rounding."""
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 3)
    fp16 = onnxq.quantize(model, batches, progress=False).model
    fp32 = onnxq.quantize(model, batches, progress=False, high_precision="fp32").model
    (cast_back,) = [n for n in fp16.graph.node if n.output[0] == "y"]
    assert cast_back.op_type == "Cast"  # the FP16 Add writes y_fp16
    low, high = analyze(model, fp16, batches), analyze(model, fp32, batches)
    assert [(x.tensor, x.producer, x.op_type, x.quantized) for x in low] == [
        (x.tensor, x.producer, x.op_type, x.quantized) for x in high
    ]
    by_name = {x.tensor: x for x in low}
    assert by_name["y"].producer == "add" and by_name["y"].quantized
    for a, b in zip(low, high, strict=True):
        for field in ("sqnr_db", "local_sqnr_db", "input_sqnr_db", "weight_sqnr_db"):
            if getattr(b, field) is None:
                assert getattr(a, field) is None
            else:  # FP16 rounding is far below INT8's (~40 dB here)
                assert getattr(a, field) == pytest.approx(getattr(b, field), abs=0.3)


def test_an_fp16_graph_input_is_fed_the_float_models_input_through_a_cast():
    """A model written without ``keep_io_types`` may read an FP32 input of the float model in
    FP16: it is the same input, fed the same values (rounded to FP16)."""
    from onnx import helper

    r = graphs.rng(0)
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("Conv", ["s", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    shape = [1, 16, 8, 8]
    model = graphs.model(
        nodes, [graphs.tensor("x", shape)], [graphs.tensor("y", shape)],
        [graphs.init("w", graphs.weight(r, 16, 16, 3, 3))],
    )  # fmt: skip
    batches = graphs.random_batches(model, 3)
    fp32 = onnxq.quantize(model, batches, progress=False, high_precision="fp32").model
    low = onnxq.quantize(model, batches, progress=False, keep_io_types=False).model
    assert low.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    got = {x.tensor: x for x in analyze(model, low, batches)}
    want = {x.tensor: x for x in analyze(model, fp32, batches)}
    assert got.keys() == want.keys() == {"s", "y"} and got["y"].quantized
    assert got["y"].local_sqnr_db == pytest.approx(want["y"].local_sqnr_db, abs=0.3)
    assert got["y"].input_sqnr_db == pytest.approx(want["y"].input_sqnr_db, abs=0.3)


def test_a_memory_budget_splits_the_comparison_into_passes_with_the_same_result(monkeypatch):
    import onnxq.analyze.compare as module

    model = graphs.residual_add()
    batches = graphs.random_batches(model, 2)
    quant = onnxq.quantize(model, batches, progress=False).model
    whole = analyze(model, quant, batches)
    sessions = []
    real = module.augmented_session

    def counting(model, graph, names, **kwargs):
        sessions.append(len(names))
        return real(model, graph, names, **kwargs)

    monkeypatch.setattr(module, "augmented_session", counting)
    split = analyze(model, quant, batches, memory_budget=1)
    assert split == whole
    # one pass per float tensor: itself and its copies (accumulated, local, fake-quantized)
    assert len(sessions) == len(whole) + 1 and max(sessions) <= 4


def test_the_worst_samples_are_named():
    model = graphs.conv_relu()
    calib = graphs.random_batches(model, 4)
    quant = onnxq.quantize(model, calib, progress=False).model
    batches = graphs.random_batches(model, 6, seed=3)
    batches[4] = {"x": batches[4]["x"] * np.float32(1e-3)}  # far below the calibrated range
    y = {x.tensor: x for x in analyze(model, quant, batches)}["conv_out"]
    assert y.worst_samples[0] == 4 and len(y.worst_samples) == 3
    assert y.worst_sample_cosine < y.cosine


def test_analyze_compares_through_a_control_flow_model():
    model = graphs.if_model()
    batches = graphs.random_batches(model, 2)
    quant = onnxq.quantize(model, batches, progress=False).model
    layers = analyze(model, quant, batches)
    assert layers and all(np.isfinite(x.cosine) for x in layers)
    assert all(x.local_cosine is not None and x.local_cosine > 0.9 for x in layers)


def test_cli_ranks_by_where_the_error_jumps_and_names_the_worst_samples(
    tmp_path, calib_dir, capsys
):
    model = graphs.residual_add()
    f, q = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, f)
    calib = calib_dir(model)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib), "-q"]) == 0
    capsys.readouterr()
    args = ["analyze", str(f), str(q), "--calib", str(calib), "--memory-budget", "1"]
    assert main([*args, "--report", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  local")]
    locals_ = [float(line.split()[1]) for line in lines]
    assert locals_ == sorted(locals_) and len(lines) == 3  # conv1, conv2, add
    assert "output 'y': cosine" in out and "worst sample cosine" in out
    assert "helps most:" in out
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["jumps"][0] in {x["tensor"] for x in saved["layers"]}


def _two_output_model(op: str) -> onnx.ModelProto:
    """x -> Conv -> Relu -> t, then ``op`` with two outputs, both graph outputs: a Split of
    t's channels, or an If whose branches return (t, -t) / (-t, t) (silero VAD's If returns
    the speech probability and the LSTM state)."""
    from onnx import TensorProto, helper

    r = graphs.rng(0)
    shape, half = [1, 16, 8, 8], [1, 8, 8, 8]
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])
    nodes = [conv, helper.make_node("Relu", ["c"], ["t"], name="relu")]
    inputs = [graphs.tensor("x", shape)]
    outputs = [graphs.tensor("first", half), graphs.tensor("second", half)]
    if op == "Split":
        nodes.append(helper.make_node("Split", ["t"], ["first", "second"], name="split", axis=1))
    else:
        outputs = [graphs.tensor("first", shape), graphs.tensor("second", shape)]

        def branch(name: str, neg_first: bool) -> onnx.GraphProto:
            ops = [
                helper.make_node("Neg", ["t"], [f"{name}_neg"], name=f"{name}_neg"),
                helper.make_node("Identity", ["t"], [f"{name}_id"], name=f"{name}_id"),
            ]
            order = [f"{name}_neg", f"{name}_id"] if neg_first else [f"{name}_id", f"{name}_neg"]
            return helper.make_graph(ops, name, [], [graphs.tensor(o, shape) for o in order])

        nodes.append(
            helper.make_node(
                "If", ["cond"], ["first", "second"], name="if",
                then_branch=branch("then", False), else_branch=branch("else", True),
            )
        )  # fmt: skip
        inputs.append(graphs.tensor("cond", [], TensorProto.BOOL))
    inits = [
        graphs.init("w", graphs.weight(r, 16, 16, 3, 3)),
        graphs.init("b", graphs.weight(r, 16)),
    ]
    return graphs.model(nodes, inputs, outputs, inits, name=f"two_outputs_{op.lower()}")


@pytest.mark.parametrize("op", ["Split", "If"])
def test_every_output_of_a_multi_output_op_is_compared(op):
    model = _two_output_model(op)
    batches = graphs.random_batches(model, 3)
    quant = onnxq.quantize(model, batches, progress=False).model
    layers = {x.tensor: x for x in analyze(model, quant, batches)}
    assert {"first", "second"} <= set(layers)  # not only the op's first output
    assert all(0.9 < layers[t].cosine < 1.0 for t in ("first", "second"))


def test_cli_says_which_control_flow_bodies_hold_unranked_quantized_ops(
    tmp_path, calib_dir, capsys
):
    from tests import control_flow_graphs as cf

    model = cf.if_convs()
    f, q = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, f)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(cf.batches(model, 4, use_then=lambda k: k % 2 == 0)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib), "-q"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(f), str(q), "--calib", str(calib)]) == 0
    captured = capsys.readouterr()
    assert "0 quantized ops" in captured.out  # the Convs sit inside the If's branches ...
    assert "activation quantizers inside control-flow bodies (2 in 'if')" in captured.err
