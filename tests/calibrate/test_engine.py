"""The streaming calibration engine: statistics equal numpy's, groups, held batches, errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq import ir
from onnxq.calibrate.engine import calibrate
from onnxq.calibrate.plan import MIN_SAMPLE_SHARE, _stride
from onnxq.data.sources import model_inputs
from onnxq.errors import CalibrationDataError
from onnxq.numerics.tensor_stats import BINS, TensorStats
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


# --------------------------------------------------------------- in-graph statistics, sampling
def batched_conv(channels: int = 16, size: int = 12) -> onnx.ModelProto:
    """x[N, C, S, S] -> Conv -> Relu -> y, with a dynamic batch axis."""
    r = graphs.rng(5)
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], name="conv", pads=[1] * 4),
        onnx.helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["N", channels, size, size])],
        [graphs.tensor("y", ["N", channels, size, size])],
        [
            graphs.init("w", graphs.weight(r, channels, channels, 3, 3)),
            graphs.init("b", graphs.weight(r, channels)),
        ],
    )


def dynamic_hw_conv(channels: int = 8) -> onnx.ModelProto:
    """x[N, 3, H, W] -> Conv -> Relu -> Conv -> y: a detector-like dynamic H/W."""
    r = graphs.rng(9)
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        onnx.helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        onnx.helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1] * 4),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["N", 3, "H", "W"])],
        [graphs.tensor("y", ["N", channels, "H", "W"])],
        [
            graphs.init("w1", graphs.weight(r, channels, 3, 3, 3)),
            graphs.init("b1", graphs.weight(r, channels)),
            graphs.init("w2", graphs.weight(r, channels, channels, 3, 3)),
            graphs.init("b2", graphs.weight(r, channels)),
        ],
    )


def test_differently_shaped_batches_give_the_statistics_of_their_values():
    # dynamic H/W: shapes that change, come back and alternate (the bound output buffers
    # are used only for batches shaped like the first; the others run unbound)
    model, inputs = prepared(dynamic_hw_conv())
    r = graphs.rng(3)
    shapes = [
        (1, 3, 16, 16),
        (1, 3, 24, 20),
        (1, 3, 16, 16),
        (2, 3, 8, 32),
        (1, 3, 16, 16),
        (1, 3, 16, 16),
        (1, 3, 24, 20),
        (1, 3, 16, 16),
    ]
    batches = [{"x": r.standard_normal(shape).astype(np.float32)} for shape in shapes]
    names = ["x", "c1", "r1", "y"]
    got = calibrate(
        model, dict.fromkeys(names, True), batches, inputs, histogram_sample=0, progress=False
    ).stats
    session = ort.InferenceSession(exposing_model(model, names), providers=["CPUExecutionProvider"])
    want = {name: TensorStats(name) for name in names}
    for batch in batches:
        for name, value in zip(names, session.run(names, batch), strict=True):
            want[name].update(value)
    for name in names:
        assert (got[name].count, got[name].min, got[name].max, got[name].range) == (
            want[name].count,
            want[name].min,
            want[name].max,
            want[name].range,
        ), name
        np.testing.assert_array_equal(got[name].counts, want[name].counts, err_msg=name)


def exposing_model(model: onnx.ModelProto, names: list[str]) -> bytes:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    exposed.graph.output.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names
    )
    return exposed.SerializeToString()


@pytest.mark.parametrize("histogram", [True, False])
def test_a_single_nan_anywhere_is_found(histogram):
    # one NaN in the middle of a tensor (not its first value) is found too
    model, inputs = prepared(graphs.log_model())
    x = np.full((1, 16, 8, 8), 2.0, np.float32)
    x[0, 7, 3, 5] = -1.0
    with pytest.raises(
        CalibrationDataError, match="'log_out' has NaN or Inf values in calibration batch 0"
    ):
        calibrate(model, {"log_out": histogram}, [{"x": x}], inputs, progress=False)


def test_sampled_histogram_holds_every_sth_value_of_each_sample_and_exact_extremes():
    model, inputs = prepared(batched_conv())
    batches = [graphs.random_inputs(model, seed=i, dynamic=3) for i in range(4)]
    result = calibrate(
        model, {"conv_out": True, "y": False}, batches, inputs, histogram_sample=100, progress=False
    )
    ref = reference_values(model, batches, ["conv_out"])["conv_out"]
    stats = result.stats["conv_out"]
    assert stats.count == ref.size  # min/max/count see every value
    assert stats.min == float(ref.min()) and stats.max == float(ref.max())
    stride = _stride(16 * 12 * 12, [3, 16, 12, 12], 100)
    assert stride == 29
    kept = ref.reshape(12, -1)[:, ::stride].ravel()  # 12 samples: 4 batches of 3
    idx = np.floor(kept * np.float32(BINS / (2 * stats.range))).astype(np.int64) + BINS // 2
    np.testing.assert_array_equal(stats.counts, np.bincount(idx, minlength=BINS))
    assert result.stats["y"].count == ref.size and result.stats["y"].counts.sum() == 0


def test_sampling_is_per_sample_so_batching_does_not_change_the_histogram():
    model, inputs = prepared(batched_conv())
    samples = [graphs.random_inputs(model, seed=i, dynamic=1) for i in range(16)]
    ones = calibrate(
        model, {"conv_out": True}, samples, inputs, histogram_sample=100, progress=False
    ).stats["conv_out"]
    fours = [{"x": np.concatenate([s["x"] for s in samples[i : i + 4]])} for i in range(0, 16, 4)]
    grouped = calibrate(
        model, {"conv_out": True}, fours, inputs, histogram_sample=100, progress=False
    ).stats["conv_out"]
    np.testing.assert_array_equal(ones.counts, grouped.counts)
    assert (ones.min, ones.max, ones.count) == (grouped.min, grouped.max, grouped.count)
    assert ones.sample_max_sum == pytest.approx(grouped.sample_max_sum, rel=1e-6)


def _time_major() -> onnx.ModelProto:
    """x [batch, 12, 32] -> Transpose -> t [12, batch, 32] (time-major, as an RNN reads it)
    -> MatMul -> y."""
    r = graphs.rng(6)
    nodes = [
        onnx.helper.make_node("Transpose", ["x"], ["t"], name="tm", perm=[1, 0, 2]),
        onnx.helper.make_node("MatMul", ["t", "w"], ["y"], name="mm"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["batch", 12, 32])],
        [graphs.tensor("y", [12, "batch", 32])],
        [graphs.init("w", graphs.weight(r, 32, 32))],
    )


def test_a_time_major_tensor_is_observed_per_sample_along_its_batch_axis():
    from onnxq.calibrate.plan import batch_axis, batch_symbols

    model, inputs = prepared(_time_major())
    graph = ir.Graph(model)
    assert batch_symbols(graph) == {"batch"} and graph.shape("t") == (12, "batch", 32)
    assert batch_axis(graph.shape("t"), batch_symbols(graph)) == 1
    assert batch_axis(graph.shape("x"), batch_symbols(graph)) == 0
    r = graphs.rng(7)
    # per-sample scales that differ, so per-time-step rows would give other moving averages
    samples = [
        {"x": (r.standard_normal((1, 12, 32)) * (1 + i)).astype(np.float32)} for i in range(8)
    ]
    fours = [{"x": np.concatenate([s["x"] for s in samples[i : i + 4]])} for i in (0, 4)]
    one, four = (
        calibrate(model, {"t": True}, data, inputs, histogram_sample=100, progress=False)
        for data in (samples, fours)
    )
    a, b = one.stats["t"], four.stats["t"]
    assert a.samples == b.samples == 8 and one.samples == four.samples == 8
    np.testing.assert_array_equal(a.counts, b.counts)
    assert a.sample_max_sum == pytest.approx(b.sample_max_sum, rel=1e-6)
    assert a.sample_max_sum == pytest.approx(sum(float(s["x"].max()) for s in samples), rel=1e-6)


def test_histogram_budget_lowers_each_samples_share_whatever_the_batching():
    model, inputs = prepared(batched_conv())
    samples = [graphs.random_inputs(model, seed=i, dynamic=1) for i in range(16)]
    fours = [{"x": np.concatenate([s["x"] for s in samples[i : i + 4]])} for i in range(0, 16, 4)]
    per_sample = 16 * 12 * 12  # 2304 values; a budget of 16 x 1024 leaves each sample 1024
    full = calibrate(
        model, {"conv_out": True}, samples, inputs, histogram_budget=0, progress=False
    ).stats["conv_out"]
    assert full.counts.sum() == 16 * per_sample
    ones, grouped = (
        calibrate(
            model,
            {"conv_out": True},
            data,
            inputs,
            histogram_budget=16 * MIN_SAMPLE_SHARE,
            progress=False,
        ).stats["conv_out"]
        for data in (samples, fours)
    )
    stride = _stride(per_sample, [1, 16, 12, 12], MIN_SAMPLE_SHARE)
    assert stride == 5  # 3 divides 12
    assert ones.counts.sum() == 16 * len(range(0, per_sample, stride))
    np.testing.assert_array_equal(ones.counts, grouped.counts)
    # min, max and count still see every value
    assert (ones.min, ones.max, ones.count) == (full.min, full.max, full.count)
    # a source read only once cannot say how many samples it holds: no budget
    once = calibrate(
        model,
        {"conv_out": True},
        iter(samples),
        inputs,
        histogram_budget=16 * MIN_SAMPLE_SHARE,
        progress=False,
    ).stats["conv_out"]
    np.testing.assert_array_equal(once.counts, full.counts)


def test_histogram_sample_zero_keeps_every_value():
    model, inputs = prepared(batched_conv())
    batches = [graphs.random_inputs(model, seed=i, dynamic=2) for i in range(3)]
    stats = calibrate(
        model, {"conv_out": True}, batches, inputs, histogram_sample=0, progress=False
    ).stats["conv_out"]
    assert stats.counts.sum() == stats.count == 3 * 2 * 16 * 12 * 12


def test_float16_rank1_and_unknown_rank_tensors_are_observed():
    nodes = [
        onnx.helper.make_node("Cast", ["x"], ["half"], to=onnx.TensorProto.FLOAT16, name="c"),
        onnx.helper.make_node("Relu", ["half"], ["half_relu"], name="r"),
        onnx.helper.make_node(
            "Cast", ["half_relu"], ["back"], to=onnx.TensorProto.FLOAT, name="c2"
        ),
        onnx.helper.make_node("ReduceSum", ["back"], ["total"], keepdims=0, name="s"),
        onnx.helper.make_node("Reshape", ["back", "shape"], ["anyrank"], name="rs"),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "ranks",
        [graphs.tensor("x", [37]), graphs.tensor("shape", [None], onnx.TensorProto.INT64)],
        [graphs.tensor("total", []), graphs.tensor("anyrank", None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = graphs.IR_VERSION
    model, inputs = prepared(model)
    assert ir.Graph(model).shape("anyrank") is None
    x = np.linspace(-3, 5, 37, dtype=np.float32)
    batch = {"x": x, "shape": np.array([37, 1], np.int64)}
    result = calibrate(
        model,
        {"half_relu": True, "x": True, "total": False, "anyrank": True},
        [batch],
        inputs,
        progress=False,
    )
    assert result.stats["half_relu"].max == 5.0 and result.stats["half_relu"].min == 0.0
    assert result.stats["x"].count == 37 and result.stats["x"].samples == 1
    assert result.stats["total"].count == 1
    assert result.stats["total"].max == pytest.approx(float(np.maximum(x, 0).sum()), rel=1e-3)
    assert result.stats["anyrank"].counts.sum() == 37  # exposed whole, numpy's statistics


def test_tensors_of_a_branch_never_taken_are_unobservable_with_the_reason():
    from tests import control_flow_graphs as cf

    model, inputs = prepared(cf.if_convs())
    batches = cf.batches(model, 2, use_then=True)
    result = calibrate(
        model, {"then_conv_out": False, "else_conv_out": False}, batches, inputs, progress=False
    )
    assert set(result.stats) == {"then_conv_out"}
    assert result.unobservable == {
        "else_conv_out": "branch never taken on the calibration data (else_branch of If 'if')"
    }
    assert result.body_runs == {"if/else_branch": 0, "if/then_branch": 2}
