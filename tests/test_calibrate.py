"""The streaming calibration engine: statistics equal numpy's, groups, held batches, errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq import ir
from onnxq.calibrate import calibrate, exposing, make_session
from onnxq.data import model_inputs
from onnxq.errors import CalibrationDataError, UnsupportedModelError
from tests import graphs


def prepared(model: onnx.ModelProto):
    model = ir.infer_shapes(model)
    return model, model_inputs(ir.Graph(model))


def reference_values(model: onnx.ModelProto, batches, names: list[str]) -> dict[str, np.ndarray]:
    """The tensors ``names`` over all batches, from onnxruntime directly."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    exposed.graph.output.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names
    )
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [session.run(names, b) for b in batches]
    return {n: np.concatenate([o[i].ravel() for o in outs]) for i, n in enumerate(names)}


def test_statistics_equal_the_tensors_values():
    model, inputs = prepared(graphs.residual_add())
    batches = graphs.random_batches(model, 5, seed=3)
    result = calibrate(
        model, {"x": True, "skip": True, "conv2_out": False}, batches, inputs, progress=False
    )
    assert result.batches_seen == 5
    ref = reference_values(model, batches, ["x", "skip", "conv2_out"])
    for name, values in ref.items():
        stats = result.stats[name]
        assert stats.count == values.size
        assert stats.min == float(values.min()) and stats.max == float(values.max())
    assert result.stats["skip"].counts.sum() == ref["skip"].size
    assert result.stats["conv2_out"].counts.sum() == 0  # no histogram asked


def test_max_batches_and_held_batches():
    model, inputs = prepared(graphs.conv_relu())
    batches = graphs.random_batches(model, 6)
    for b in batches:
        b["x"] = b["x"].astype(np.float64)  # held batches come back in the model's dtype
    result = calibrate(model, {"x": True}, batches, inputs, max_batches=4, hold=2, progress=False)
    assert result.batches_seen == 4
    assert result.stats["x"].count == 4 * batches[0]["x"].size
    assert len(result.held) == 2
    assert result.held[0]["x"].dtype == np.float32
    np.testing.assert_array_equal(result.held[1]["x"], batches[1]["x"].astype(np.float32))


def test_memory_budget_splits_tensors_into_passes_with_the_same_result():
    model, inputs = prepared(graphs.residual_add())
    batches = graphs.random_batches(model, 3)
    tensors = {"x": True, "skip": True, "conv2_out": True}
    one = calibrate(model, tensors, batches, inputs, progress=False)
    split = calibrate(model, tensors, batches, inputs, memory_budget=1, progress=False)
    assert split.batches_seen == one.batches_seen == 3
    for name in tensors:
        assert split.stats[name].count == one.stats[name].count
        np.testing.assert_array_equal(split.stats[name].counts, one.stats[name].counts)


def test_several_passes_refuse_a_one_shot_iterator():
    model, inputs = prepared(graphs.residual_add())
    once = iter(graphs.random_batches(model, 3))
    with pytest.raises(CalibrationDataError, match="can be read only once"):
        calibrate(model, {"x": True, "skip": True}, once, inputs, memory_budget=1, progress=False)


def test_a_generator_is_fine_for_a_single_pass():
    model, inputs = prepared(graphs.conv_relu())
    result = calibrate(
        model, {"x": True}, (b for b in graphs.random_batches(model, 3)), inputs, progress=False
    )
    assert result.batches_seen == 3


def test_empty_source_raises():
    model, inputs = prepared(graphs.conv_relu())
    with pytest.raises(CalibrationDataError, match="yielded no batches"):
        calibrate(model, {"x": True}, [], inputs, progress=False)


def test_bad_batch_is_reported_with_its_index():
    model, inputs = prepared(graphs.conv_relu())
    batches = graphs.random_batches(model, 3)
    batches[2] = {"x": batches[2]["x"][:, :8]}
    with pytest.raises(CalibrationDataError, match="calibration batch 2: input 'x' has shape"):
        calibrate(model, {"x": True}, batches, inputs, progress=False)


def test_nan_produced_inside_the_model_names_the_tensor_and_batch():
    model, inputs = prepared(graphs.log_model())
    batches = [
        {"x": np.full((1, 16, 8, 8), 2.0, np.float32)},
        {"x": np.full((1, 16, 8, 8), -1.0, np.float32)},
    ]
    with pytest.raises(
        CalibrationDataError, match="'log_out' has NaN or Inf values in calibration batch 1"
    ):
        calibrate(model, {"log_out": True}, batches, inputs, progress=False)


def test_exposing_shows_exactly_the_observed_tensors_and_restores_the_outputs():
    model, _ = prepared(graphs.residual_add())
    before = ir.serialize(model)
    with exposing(model, ir.Graph(model), ["skip", "conv2_out"]) as aug:
        assert [o.name for o in aug.graph.output] == ["skip", "conv2_out"]
    assert ir.serialize(model) == before  # the original keeps its outputs
    with pytest.raises(RuntimeError), exposing(model, ir.Graph(model), ["skip"]):
        raise RuntimeError("interrupted")
    assert ir.serialize(model) == before  # ... even when the block fails


def test_make_session_wraps_onnxruntime_failures():
    model = graphs.conv_relu()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="onnxruntime cannot load the model"):
        make_session(model)
