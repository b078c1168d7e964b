"""One batch's observation: in-graph maxima equal the whole tensor's statistics, NaN and stale
shapes are errors, every job runs once and the first failure by position is raised."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxq import ir
from onnxq.calibrate.engine import calibrate
from onnxq.calibrate.plan import peaks_plan
from onnxq.errors import CalibrationDataError, UnsupportedModelError
from onnxq.numerics.tensor_stats import TensorStats
from tests import graphs
from tests.calibrate.test_engine import batched_conv, prepared, reference_values


def test_a_relu_output_is_observed_in_the_graph_with_the_same_statistics():
    # y = Relu(conv_out): its per-channel maxima come from an in-graph GlobalMaxPool; min,
    # max, count, per-sample sums and channel peaks equal those of the whole tensor
    model, inputs = prepared(batched_conv())
    graph = ir.Graph(model)
    assert peaks_plan(graph, "y") is not None  # observed in the graph
    assert peaks_plan(graph, "conv_out") is None  # signed: exposed whole
    batches = [graphs.random_inputs(model, seed=i, dynamic=3) for i in range(4)]
    got = calibrate(
        model, {"y": False}, batches, inputs, channels=frozenset({"y"}), progress=False
    ).stats["y"]
    want = TensorStats("y", histogram=False, channels=True)
    for b in batches:
        want.update(
            np.maximum(
                reference_values(model, [b], ["conv_out"])["conv_out"].reshape(3, 16, 12, 12), 0
            )
        )
    assert got.nonnegative and (got.count, got.samples) == (want.count, want.samples) == (
        4 * 3 * 16 * 144,
        12,
    )
    assert (got.min, got.max) == (0.0, want.max) and want.min == 0.0
    assert got.sample_max_sum == pytest.approx(want.sample_max_sum, rel=1e-12)
    assert got.sample_min_sum == want.sample_min_sum == 0.0
    np.testing.assert_array_equal(got.channel_amax, want.channel_amax)
    # with a histogram the values themselves are needed: the tensor is exposed whole
    hist = calibrate(model, {"y": True}, batches, inputs, progress=False).stats["y"]
    assert (hist.max, hist.count) == (want.max, want.count) and hist.counts.sum() == want.count


def test_nan_in_an_in_graph_observed_tensor_is_an_error():
    # Exp(Log(x)) >= 0 is observed in the graph; x < 0 makes every value NaN
    nodes = [onnx.helper.make_node("Log", ["x"], ["l"]), onnx.helper.make_node("Exp", ["l"], ["e"])]
    model, inputs = prepared(
        graphs.model(nodes, [graphs.tensor("x", [1, 4, 8, 8])], [graphs.tensor("e", [1, 4, 8, 8])])
    )
    assert peaks_plan(ir.Graph(model), "e") is not None
    with pytest.raises(CalibrationDataError, match="'e' has NaN or Inf values in calibration"):
        calibrate(
            model, {"e": False}, [{"x": -np.ones((1, 4, 8, 8), np.float32)}], inputs, progress=False
        )


def test_stale_declared_shapes_do_not_mix_up_channels():
    # the model declares y with 8 channels, onnxruntime computes 16
    model = graphs.conv_relu()
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 8
    model, inputs = prepared(model)
    assert ir.Graph(model).shape("y") == (1, 8, 8, 8) and peaks_plan(ir.Graph(model), "y")
    batches = graphs.random_batches(model, 3)
    # a re-iterable source: shapes inferred afresh for the first batch disagree, so y is
    # read whole and its statistics are right
    stats = calibrate(model, {"y": False}, batches, inputs, progress=False).stats["y"]
    assert stats.max == float(reference_values(model, batches, ["y"])["y"].max())
    # a source read once cannot be looked at first: the mismatch is found at run time
    with pytest.raises(UnsupportedModelError, match="onnxruntime gives 16 channels in all"):
        calibrate(model, {"y": False}, iter(batches), inputs, progress=False)


def test_batch_work_runs_every_job_once_and_raises_the_first_failure_by_position():
    from concurrent.futures import ThreadPoolExecutor

    from onnxq.calibrate.batch import BatchWork

    ran: list[int] = []

    def job(k: int):
        def run() -> None:
            ran.append(k)
            if k in (1, 3):
                raise CalibrationDataError(f"job {k} failed")

        return run

    with ThreadPoolExecutor(max_workers=1) as pool:
        for _ in range(20):  # whichever thread meets a failure first, job 1's is raised
            ran.clear()
            work = BatchWork([job(k) for k in range(6)], order=[3, 5, 1, 0, 2, 4])
            work.start(pool)
            with pytest.raises(CalibrationDataError, match="job 1 failed"):
                work.finish()
            assert sorted(ran) == list(range(6))
        work = BatchWork([job(k) for k in (0, 2, 4)], order=[])
        work.start(pool)
        work.finish()
        assert sorted(ran[-3:]) == [0, 2, 4]
