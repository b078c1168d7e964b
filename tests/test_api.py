"""The pipeline end to end: sources, configs, saving, determinism, fidelity."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.config.resolve import resolve_config
from onnxq.errors import (
    CalibrationDataError,
    ConfigError,
    OnnxqError,
    OutputError,
    UnsupportedModelError,
)
from onnxq.numerics.observers import METHODS
from onnxq.place.facts import GraphFacts
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
    assert not any("agrees with the float model" in w for w in result.report.warnings)


def test_the_report_notes_when_the_histogram_budget_sampled_a_histogram_more_sparsely():
    # conv_relu's tensors hold 1024 values per sample: a share of 1024 changes nothing
    assert not any(
        "histogram(s) counted" in n
        for n in quantize(graphs.conv_relu(), histogram_budget=1).report.notes
    )
    big = graphs.residual_add(channels=32)  # x and skip: 2048 values per sample, every 3rd
    note = "2 histogram(s) counted at most 1024 values per sample (of histogram_sample=65536)"
    assert any(note in n for n in quantize(big, histogram_budget=1).report.notes)
    assert not any("histogram(s) counted" in n for n in quantize(big).report.notes)


def test_a_model_newer_than_onnxruntime_reads_is_stamped_with_the_version_it_reads():
    newest = ir.runtime_ir_version()
    if newest >= onnx.IR_VERSION:
        pytest.skip(
            f"this onnxruntime reads IR {newest}, as new as onnx {onnx.__version__} "
            "writes: no newer model to fit"
        )
    model = graphs.conv_relu()
    model.ir_version = onnx.IR_VERSION  # what onnx.helper.make_model writes
    result = quantize(model)
    assert result.model.ir_version == newest and model.ir_version == onnx.IR_VERSION
    assert any(
        f"IR version {onnx.IR_VERSION} is newer than onnxruntime" in n for n in result.report.notes
    )
    assert result.report.fidelity[0].cosine > 0.999  # calibrated and validated in onnxruntime


def test_an_output_with_nan_in_the_float_model_is_reported_and_saved(tmp_path):
    # Sqrt(conv_out - 0.5) is NaN wherever the conv gives less than 0.5, in both models
    model = graphs.conv_relu()
    model.graph.node[1].CopyFrom(
        onnx.helper.make_node("Sub", ["conv_out", "half"], ["shifted"], name="sub")
    )
    model.graph.node.append(onnx.helper.make_node("Sqrt", ["shifted"], ["y"], name="sqrt"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(0.5), "half"))
    result = quantize(model, fidelity_batches=2)
    (fid,) = result.report.fidelity
    assert fid.nonfinite > 0 and 0.99 < fid.cosine <= 1.0
    assert any("value(s) of the float model are NaN/Inf" in n for n in result.report.notes)
    # rounding moves a few conv outputs near 0.5 across Sqrt's domain edge
    assert 0 < fid.nonfinite_mismatch < fid.nonfinite / 100
    assert any("NaN/Inf in one model but not in the other" in w for w in result.report.warnings)
    written = result.save(tmp_path / "q.onnx", report=tmp_path / "q.json")
    assert [p.name for p in written] == ["q.onnx", "q.json"]
    saved = json.loads((tmp_path / "q.json").read_text(encoding="utf-8"))
    assert saved["fidelity"]["outputs"][0]["nonfinite"] == fid.nonfinite


def test_a_softmax_output_gets_its_top1_agreement_in_the_report():
    model = graphs.conv_relu()
    model.graph.node.append(onnx.helper.make_node("Softmax", ["y"], ["p"], name="sm", axis=1))
    model.graph.output[0].CopyFrom(
        onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 16, 8, 8])
    )
    result = quantize(model, fidelity_batches=2)
    (fid,) = result.report.fidelity
    assert fid.name == "p" and 0.9 <= fid.top1_agreement <= 1.0
    assert f"top-1 agreement {fid.top1_agreement:.2%}" in result.report.summary()


def _one_loud_channel(size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """4 batches of x (1, 16, size, size) whose channel 0 is 500x larger than the others."""
    r = graphs.rng(seed)
    return [
        {
            "x": (
                r.standard_normal((1, 16, size, size)) * np.array([500] + [1] * 15)[:, None, None]
            ).astype(np.float32)
        }
        for _ in range(4)
    ]


def test_an_output_that_int8_ruins_gets_a_low_fidelity_warning():
    # the conv reads only channels 1-15, which one per-tensor scale set by channel 0 (500x
    # larger) rounds to zero
    model = graphs.conv_relu()
    for init in model.graph.initializer:
        value = onnx.numpy_helper.to_array(init).copy()
        if init.name == "conv.weight":
            value[:, 0] = 0
        else:
            value[:] = 0
        init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))
    result = onnxq.quantize(model, _one_loud_channel(8, seed=3), method="minmax", progress=False)
    (fid,) = result.report.fidelity
    assert fid.cosine < 0.95
    (warning,) = [w for w in result.report.warnings if "agrees with the float model" in w]
    assert warning.startswith(f"output 'y' agrees with the float model at cosine {fid.cosine:.3f}")
    assert "onnxq analyze" in warning


def test_a_lost_part_of_an_output_gets_a_warning_though_the_whole_agrees():
    # output channels 0-14 read input channel 0 (500x larger), channel 15 reads channels 1-15,
    # which one per-tensor scale set by channel 0 rounds to zero: channel 15 is lost, while
    # the whole output's cosine (carried by the large channels) stays high
    model = graphs.conv_relu(size=32)  # (1, 16, 32, 32): the channels are the smallest axis
    w = np.zeros((16, 16, 3, 3), dtype=np.float32)
    w[:15, 0, 1, 1] = 1.0
    w[15, 1:, 1, 1] = 1.0
    for init in model.graph.initializer:
        value = w if init.name == "conv.weight" else np.zeros(16, dtype=np.float32)
        init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))
    result = onnxq.quantize(model, _one_loud_channel(32, seed=4), method="minmax", progress=False)
    (fid,) = result.report.fidelity
    assert fid.cosine > 0.99 and (fid.slice_axis, fid.slices, fid.worst_slice) == (1, 16, 15)
    assert fid.worst_slice_cosine < 0.5
    assert (
        f"worst of 16 slices along axis 1: cosine {fid.worst_slice_cosine:.6f} (index 15)"
        in result.report.summary()
    )
    (warning,) = [w for w in result.report.warnings if "slice 15 along axis 1" in w]
    assert warning.startswith(
        f"output 'y' agrees with the float model at cosine {fid.cosine:.3f} as a whole"
    )
    saved = result.report.to_dict()["fidelity"]["outputs"][0]
    assert saved["worst_slice"] == 15 and saved["slice_axis"] == 1


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
    result = quantize(graphs.matmul_act(), high_precision="fp32")
    assert graphs.op_types(result.model) == ["MatMul"]
    assert result.report.placed == [] and result.report.fidelity[0].cosine == 1.0
    # TensorRT's default: the float MatMul computes in FP16, FP32 at the graph's edges
    half = quantize(graphs.matmul_act())
    assert [n.op_type for n in half.model.graph.node].count("MatMul") == 1
    (matmul,) = (n for n in half.model.graph.node if n.op_type == "MatMul")
    inferred = onnx.shape_inference.infer_shapes(half.model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    assert types[matmul.output[0]] == onnx.TensorProto.FLOAT16
    assert [o.type.tensor_type.elem_type for o in half.model.graph.output] == [1]
    assert half.report.placed == [] and half.report.fidelity[0].cosine > 0.9999
    assert any(
        w.startswith("no op of this model is quantized for tensorrt")
        for w in result.report.warnings
    )


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
    assert "ranges differ" in concat.reason and "(> 8x)" in concat.reason
    same = onnxq.quantize(
        graphs.two_branch_concat(channels=64), batches, backend="onnxruntime", progress=False
    )
    assert next(d for d in same.report.decisions if d.node == "concat").quantized


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_old_ir_model_with_weights_as_inputs_gives_a_valid_model(backend):
    # IR 3 / opset 9, as the onnx package's own "light" model-zoo files: every initializer
    # is also a graph input.  The Q/DQ constants must not make the output invalid, and the
    # weights must not stay overridable inputs (onnxruntime would neither fold nor fuse them)
    model = graphs.residual_add()
    model.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in model.graph.initializer
    )
    model.ir_version = 3
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("", 9))
    result = quantize(model, backend=backend)
    onnx.checker.check_model(result.model, full_check=True)
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert "QuantizeLinear" in graphs.op_types(result.model)
    assert check(result.model, PROFILES[backend]) == []
    assert any("initializers were also graph inputs" in w for w in result.report.warnings)
    assert result.report.fidelity[0].cosine > 0.999
    # the report says the opset changed (opset 13: per-channel Q/DQ; 19: TensorRT's FP16
    # Q/DQ scales)
    opset = 19 if backend == "tensorrt" else 13
    assert [o.version for o in result.model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    assert f"the model's opset 9 was converted to {opset}" in " ".join(result.report.notes)


def test_an_onnxruntime_failure_after_an_opset_upgrade_says_so():
    # a Reshape to a fixed size the data does not have: onnxruntime fails on the converted model
    nodes = [onnx.helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", ["N", 6])],
        [graphs.tensor("y", [4, 4])],
        [graphs.init("shape", np.array([4, 4], np.int64))],
        opset=11,
    )
    batches = [{"x": np.ones((1, 6), np.float32)}] * 2
    with pytest.raises(OnnxqError) as caught:
        onnxq.quantize(model, batches, progress=False)
    # calibration observes the graph's output too (the FP16 plan reads its peak), so the
    # failure shows on the first batch
    assert "onnxruntime failed on it" in str(caught.value)
    # the hint is a note on the error (PEP 678), which the CLI prints after the message
    assert caught.value.__notes__ == [
        "the model's opset 11 was converted to 19 before onnxruntime ran it: if the "
        "original runs, the conversion is at fault; re-export the model with opset >= 19"
    ]
    # the same failure at opset 13 has nothing to blame on a conversion (FP32 compute: no
    # FP16 Q/DQ scales to convert to opset 19 for)
    model.opset_import[0].version = 13
    with pytest.raises(OnnxqError) as caught:
        onnxq.quantize(model, batches, progress=False, high_precision="fp32")
    assert "fails in onnxruntime" in str(caught.value)
    assert "converted" not in str(caught.value) and not getattr(caught.value, "__notes__", [])
    # nor has a model whose nodes onnxq only sorted
    model.graph.node.insert(0, onnx.helper.make_node("Relu", ["y"], ["z"], name="relu"))
    model.graph.output[0].name = "z"
    with pytest.raises(OnnxqError) as caught:
        onnxq.quantize(model, batches, progress=False, high_precision="fp32")
    assert "fails in onnxruntime" in str(caught.value)
    assert "converted" not in str(caught.value) and not getattr(caught.value, "__notes__", [])


@pytest.mark.parametrize("first", ["onnxruntime", "tensorrt"])
def test_an_already_quantized_model_is_refused_with_a_clear_error(first):
    model = graphs.residual_add()
    quantized = quantize(model, backend=first).model
    with pytest.raises(UnsupportedModelError, match=r"already quantized .*QuantizeLinear"):
        quantize(quantized, backend="tensorrt")


def test_a_float16_model_is_quantized_and_keeps_its_types():
    model = graphs.conv_relu()
    for t in model.graph.initializer:
        half = onnx.numpy_helper.to_array(t).astype(np.float16)
        t.CopyFrom(onnx.numpy_helper.from_array(half, t.name))
    for vi in [*model.graph.input, *model.graph.output]:
        vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    batches = [
        {k: v.astype(np.float16) for k, v in b.items()} for b in graphs.random_batches(model, 2)
    ]
    result = onnxq.quantize(model, batches, progress=False)
    assert "QuantizeLinear" in graphs.op_types(result.model)  # (tests/prepare/test_upcast.py)
    assert not any("float32 original" in w for w in result.report.warnings)
    assert [i.type.tensor_type.elem_type for i in result.model.graph.input] == [10]
    onnx.checker.check_model(result.model, full_check=True)


def _depthwise_batches(weak: bool) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(7)
    gain = np.where(np.arange(16) % 2, 0.01, 1.0) if weak else np.ones(16)
    return [
        {"x": (r.standard_normal((1, 16, 8, 8)) * gain[None, :, None, None]).astype(np.float32)}
        for _ in range(4)
    ]


@pytest.mark.parametrize(
    ("weak", "fraction", "quantized"), [(True, 0.25, False), (False, 0.25, True), (True, 1.0, True)]
)
def test_depthwise_conv_with_weak_input_channels_stays_float(weak, fraction, quantized):
    # half the channels peak at 1% of the others: a per-tensor int8 scale leaves them ~1
    # level, and a depthwise conv gives each channel its own outputs
    model = graphs.grouped_conv(channels=16, group=16, kernel=3)
    result = onnxq.quantize(
        model, _depthwise_batches(weak), progress=False, weak_channel_fraction=fraction
    )
    (conv,) = [d for d in result.report.decisions if d.node == "conv"]
    assert conv.quantized == quantized
    if not quantized:
        assert "8 of its input's 16 channels peak below 1/16" in conv.reason


def test_a_label_map_output_is_compared_by_its_probabilities():
    # scikit-learn exports classifiers with a ZipMap (ai.onnx.ml): one {label: p} map per
    # sample; fidelity compares the probabilities instead of calling the maps unequal
    from onnx import TensorProto, helper

    r = graphs.rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["p"], name="softmax", axis=1),
        helper.make_node(
            "ZipMap",
            ["p"],
            ["maps"],
            name="zipmap",
            domain="ai.onnx.ml",
            classlabels_int64s=[0, 1, 2, 3],
        ),
    ]
    maps = helper.make_value_info(
        "maps",
        helper.make_sequence_type_proto(
            helper.make_map_type_proto(
                TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
            )
        ),
    )
    graph = helper.make_graph(
        nodes,
        "zipmap",
        [graphs.tensor("x", ["N", 32])],
        [maps],
        [
            graphs.init("w1", graphs.weight(r, 32, 64, scale=0.3)),
            graphs.init("w2", graphs.weight(r, 64, 4, scale=0.3)),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    )
    model.ir_version = graphs.IR_VERSION
    data = [{"x": graphs.rng(i).standard_normal((8, 32)).astype(np.float32)} for i in range(4)]
    result = onnxq.quantize(model, data, backend="onnxruntime", progress=False)
    (fid,) = result.report.fidelity
    assert fid.name == "maps" and fid.compared == "cosine" and 0.99 < fid.cosine <= 1.0
    assert "fidelity maps (" in result.report.summary()
    reasons = {d.node: d.reason for d in result.report.decisions if not d.quantized}
    assert reasons["zipmap"] == "ONNX-ML op (ai.onnx.ml) stays float"


def test_a_model_with_per_element_sigmoid_scores_is_calibrated_with_minmax_and_noted():
    result = quantize(graphs.with_tail(graphs.conv_relu(), "Sigmoid"), score_map_ranges="minmax")
    assert {p.qparams.method for p in result.report.placed if p.kind == "activation"} == {"minmax"}
    (note,) = (n for n in result.report.notes if "per-element sigmoid scores" in n)
    assert f"note: {note}" in result.report.summary()
    assert note in json.loads(result.report.to_json())["notes"]


def _worst_cosine(result: onnxq.QuantizedModel) -> float:
    return min(f.cosine for f in result.report.fidelity if f.compared == "cosine")


def _heavy_tailed_batches(model: onnx.ModelProto, count: int) -> list[dict[str, np.ndarray]]:
    batches = graphs.random_batches(model, count)
    for i, batch in enumerate(batches):
        batch["x"] = graphs.rng(100 + i).standard_t(2, batch["x"].shape).astype(np.float32)
    return batches


@pytest.mark.parametrize("case", ["clipping wins", "tie"])
def test_a_score_map_model_is_quantized_both_ways_and_keeps_the_better(case):
    # minmax everywhere keeps a detector's peaks (PP-OCRv4 det); where rare large values set
    # every range (PP-OCRv3 det: map cosine 0.870 against 0.985) the per-tensor choice wins
    if case == "clipping wins":
        model = graphs.two_head_detector()
        data = _heavy_tailed_batches(model, 8)
    else:  # every activation takes minmax either way: the same model twice
        model = graphs.with_tail(graphs.conv_relu(), "Sigmoid")
        data = graphs.random_batches(model, 8)
    result = onnxq.quantize(model, data, progress=False)
    runs = {
        way: onnxq.quantize(model, data, score_map_ranges=way, progress=False)
        for way in ("minmax", "auto")
    }
    worst = {way: _worst_cosine(run) for way, run in runs.items()}
    kept = {"clipping wins": "auto", "tie": "minmax"}[case]
    assert (worst["auto"] > worst["minmax"]) == (kept == "auto")
    assert ir.serialize(result.model) == ir.serialize(runs[kept].model)
    (note,) = [n for n in result.report.notes if n.startswith("score_map_ranges: compare")]
    assert f"minmax {worst['minmax']:.4f}, auto {worst['auto']:.4f}" in note
    assert ("kept the per-tensor choice" in note) == (kept == "auto")
    assert result.report.config["score_map_ranges"] == "compare"


def test_a_score_map_model_is_quantized_once_where_the_data_cannot_be_read_twice():
    model = graphs.with_tail(graphs.conv_relu(), "Sigmoid")
    data = graphs.random_batches(model, 8)
    once = onnxq.quantize(model, iter(data), progress=False)  # a one-shot iterator
    minmax = onnxq.quantize(model, data, score_map_ranges="minmax", progress=False)
    assert ir.serialize(once.model) == ir.serialize(minmax.model)
    assert not any(n.startswith("score_map_ranges: compare") for n in once.report.notes)
    other = quantize(graphs.conv_relu())  # no score map: one run, no note
    assert not any(n.startswith("score_map_ranges") for n in other.report.notes)


def test_a_calibration_of_few_samples_gets_a_warning():
    model = graphs.conv_relu()
    few = quantize(model).report.warnings  # 4 batches
    samples = 4 * graphs.random_batches(model, 1)[0]["x"].shape[0]
    assert any(f"the ranges come from {samples} calibration sample(s)" in w for w in few)
    assert any("crops or scales of each image" in w for w in few)  # an NCHW input
    sequence = graphs.matmul_const()  # x[1, 4, K]: no image, no advice about crops
    warned = onnxq.quantize(sequence, graphs.random_batches(sequence, 4), progress=False)
    assert any("calibration sample(s)" in w and "image" not in w for w in warned.report.warnings)
    enough = onnxq.quantize(model, graphs.random_batches(model, 32), progress=False)
    assert not any("calibration sample(s)" in w for w in enough.report.warnings)


def test_the_python_api_keeps_the_error_contract():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 2)
    with pytest.raises(ConfigError, match="unknown option 'methd'"):
        onnxq.quantize(model, batches, methd="minmax")
    # one pattern given as a string is one pattern, not its characters
    result = onnxq.quantize(model, batches, exclude="conv", progress=False)
    assert result.report.config["exclude"] == ["conv"]


def test_batches_without_samples_are_refused():
    model = graphs.conv_relu()
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    empty = [{k: v[:0] for k, v in b.items()} for b in graphs.random_batches(model, 2)]
    with pytest.raises(CalibrationDataError, match="hold no samples"):
        onnxq.quantize(model, empty, progress=False)


def test_an_error_larger_than_the_float_range_is_warned_about_despite_a_high_cosine(monkeypatch):
    from onnxq.backends.validate import OutputFidelity
    from onnxq.validate import verify

    model = graphs.conv_relu()
    monkeypatch.setattr(verify, "fidelity", lambda *_a: [OutputFidelity("y", 0.993, 149.6, 90.5)])
    warnings = onnxq.quantize(
        model, graphs.random_batches(model, 32), progress=False
    ).report.warnings
    assert any("off by 150, more than the largest float value (90.5)" in w for w in warnings)
    monkeypatch.setattr(verify, "fidelity", lambda *_a: [OutputFidelity("y", 0.993, 9.6, 90.5)])
    warnings = onnxq.quantize(
        model, graphs.random_batches(model, 32), progress=False
    ).report.warnings
    assert not any("more than the largest float value" in w for w in warnings)


def _speech_batches(pauses: bool) -> list[dict[str, np.ndarray]]:
    # [1, 1, 96] clips; with a pause, the last 72 steps are near-silent (1e-3 of the speech)
    r = np.random.default_rng(11)
    gain = np.where(np.arange(96) < 24, 1.0, 1e-3) if pauses else np.ones(96)
    return [{"x": (r.standard_normal((1, 1, 96)) * gain).astype(np.float32)} for _ in range(8)]


@pytest.mark.parametrize(
    ("pauses", "fraction", "float_convs"),
    [(True, 0.25, {"conv1", "conv2"}), (False, 0.25, set()), (True, 1.0, set())],
)
def test_convs_before_a_layer_norm_stay_float_when_many_frames_are_quiet(
    pauses, fraction, float_convs
):
    model = graphs.feature_encoder()
    result = onnxq.quantize(
        model, _speech_batches(pauses), progress=False, weak_position_fraction=fraction
    )
    kept = {
        d.node
        for d in result.report.decisions
        if d.op_type == "Conv" and not d.quantized and "positions (frames)" in d.reason
    }
    assert kept == float_convs
    # conv0 reads one channel: float by min_channels whatever the data
    assert all(
        d.quantized
        for d in result.report.decisions
        if d.op_type == "Conv" and d.node not in float_convs | {"conv0"}
    )


def test_an_output_of_another_size_is_warned_about(monkeypatch):
    from onnxq.backends.validate import OutputFidelity
    from onnxq.validate import verify

    model = graphs.conv_relu()
    changed = "not compared: the quantized model gives 243 values, the float model 231"
    monkeypatch.setattr(
        verify, "fidelity", lambda *_a: [OutputFidelity("y", 0.0, 0.0, 0.0, changed)]
    )
    warnings = onnxq.quantize(
        model, graphs.random_batches(model, 32), progress=False
    ).report.warnings
    assert any(
        w.startswith(
            "output 'y': the quantized model gives 243 values, the float "
            "model 231 on the held batches"
        )
        for w in warnings
    )


@pytest.mark.parametrize("identity", [False, True])
def test_a_shared_bias_is_quantized_at_each_layers_scale(identity):
    # one int32 copy at the first layer's scale read by both QGemms was 0.885 fused; read
    # through Identity copies (which simplify removes) it was a violation and no output
    from tests.test_ir import _shared_bias_gemms

    model = _shared_bias_gemms(identity)
    result = onnxq.quantize(
        model, graphs.random_batches(model, 8), backend="onnxruntime", progress=False
    )
    assert not result.report.violations
    assert {"fc1", "fc2"} <= {d.node for d in result.report.decisions if d.quantized}
    biases = [n.input[2] for n in result.model.graph.node if n.op_type == "Gemm"]
    assert len(set(biases)) == 2
    (out,) = result.report.fidelity  # measured with onnxruntime's fusion on
    assert out.cosine > 0.999


def test_a_conv_output_read_by_a_hardswish_is_clipped_where_the_hardswish_saturates(monkeypatch):
    # onnxruntime requantizes the conv's output for its QLinearConv; below -3 a hardswish is 0,
    # so the range stops there and its steps get finer.  The gain is measured where the range
    # acts: on the hardswish of the conv output's int8 round trip.  The whole model's cosine
    # also carries the weights' rounding, which was 7-bit on a CPU without int8 dot products
    # (``reduce_range``) and hid the gain there (1 - 0.999864 against 1 - 0.999847)
    import onnxruntime as ort

    model = graphs.conv_hardswish("pair")
    batches = graphs.random_batches(model, 8)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info("c1_out", 1, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    conv_out = np.concatenate([session.run(["c1_out"], b)[0].ravel() for b in batches])

    def hardswish(x: np.ndarray) -> np.ndarray:
        return x * np.clip(x / 6 + 0.5, 0, 1)

    def hardswish_error() -> tuple[dict, float]:
        result = onnxq.quantize(
            model, batches, backend="onnxruntime", method="minmax", progress=False
        )
        entry = next(
            t
            for t in json.loads(result.report.to_json())["quantized_tensors"]
            if t["tensor"] == "c1_out"
        )
        scale, zero = entry["scale"], entry["zero_point"]
        dequantized = (np.clip(np.rint(conv_out / scale) + zero, 0, 255) - zero) * scale
        return entry, float(np.linalg.norm(hardswish(dequantized) - hardswish(conv_out)))

    entry, error = hardswish_error()
    assert entry["range"][0] <= -3.0 < entry["range"][0] + entry["scale"]
    assert entry["bound"].endswith("every reader saturates beyond")
    monkeypatch.setattr(GraphFacts, "saturation_bounds", lambda self, consumers: None)
    free, free_error = hardswish_error()
    assert free["range"][0] < -10 and "bound" not in free
    assert error < 0.8 * free_error


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_outputs_after_non_max_suppression_are_compared_as_selections(backend):
    # the kept detections' order and number move with their scores: "labels differ in 96%"
    # said nothing about how many detections survived
    from onnxq.backends.validate import selected_outputs

    model = graphs.nms_detector()
    assert selected_outputs(model) == {"picked": "NonMaxSuppression", "sel": "NonMaxSuppression"}
    assert selected_outputs(graphs.conv_relu()) == {}
    report = onnxq.quantize(
        model, graphs.random_batches(model, 8), backend=backend, progress=False
    ).report
    assert "fc1" in {d.node for d in report.decisions if d.quantized}
    assert {f.name: f.selected_by for f in report.fidelity} == {
        "picked": "NonMaxSuppression",
        "sel": "NonMaxSuppression",
    }
    sel = next(f for f in report.fidelity if f.name == "sel")
    assert sel.compared == "agreement" and sel.cosine < 1.0  # some kept rows moved
    (warning,) = [w for w in report.warnings if "'sel'" in w]
    assert "holds the rows NonMaxSuppression keeps" in warning
    assert "match the detections" in warning
    assert "rows selected by NonMaxSuppression, compared by position" in report.summary()


def test_an_output_lost_on_most_samples_gets_a_warning_though_the_whole_agrees(monkeypatch):
    from onnxq.backends.validate import OutputFidelity

    def dominated(reference, quantized, *args):
        return [
            OutputFidelity(
                "y", 0.962, 0.5, 30.0, sample_cosine_mean=0.476, worst_sample_cosine=-0.502
            )
        ]

    monkeypatch.setattr("onnxq.validate.verify.fidelity", dominated)
    report = quantize(graphs.conv_relu()).report
    (warning,) = [w for w in report.warnings if w.startswith("output 'y'")]
    assert "cosine 0.962 over all held samples together, but at 0.476 per sample" in warning
    assert "worst -0.502" in warning
    assert "per sample 0.476000 on average (worst -0.502000)" in report.summary()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_calibrates_differently_shaped_batches(method):
    # a detector-like model with dynamic H/W, fed batches of four shapes
    r = graphs.rng(4)
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        onnx.helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        onnx.helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1] * 4),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", ["N", 16, "H", "W"])],
        [graphs.tensor("y", ["N", 32, "H", "W"])],
        [
            graphs.init("w1", graphs.weight(r, 32, 16, 3, 3)),
            graphs.init("b1", graphs.weight(r, 32)),
            graphs.init("w2", graphs.weight(r, 32, 32, 3, 3)),
            graphs.init("b2", graphs.weight(r, 32)),
        ],
    )
    shapes = [(1, 16, 32, 32), (1, 16, 48, 24), (2, 16, 16, 40), (1, 16, 32, 32)] * 4
    batches = [{"x": r.standard_normal(s).astype(np.float32)} for s in shapes]
    result = onnxq.quantize(model, batches, method=method, progress=False)
    assert check(result.model, PROFILES["tensorrt"]) == []
    activations = [p for p in result.report.placed if p.kind == "activation"]
    assert {p.tensor for p in activations} == {"x", "r1"}  # both convs' inputs
    for p in activations:  # auto and robust_minmax add their choice ("auto:mse"); auto means
        # the profile's head method for a graph output's reader (r1 here)
        assert p.qparams.method.split(":")[0] == method or method == "auto", p.qparams.method
        assert float(p.qparams.scale) > 0
