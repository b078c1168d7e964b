"""Sharded calibration (``onnxq.calibrate.shards``) in this process: whatever the shard sizes,
the output model is byte-identical to the run without an executor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.calibrate.plan import plan_calibration
from onnxq.calibrate.shards import MAX_SHARD, STREAM_SHARD, shard_size
from onnxq.data.sources import NpzFolder, model_inputs, open_source
from onnxq.errors import CalibrationDataError
from onnxq.scale import InProcess
from tests import control_flow_graphs as cf
from tests import graphs


def quantized_bytes(model: onnx.ModelProto, data: object, **options: object) -> bytes:
    result = onnxq.quantize(model, data, progress=False, fidelity_batches=2, **options)
    return result.model.SerializeToString()


def _cases() -> list[tuple[str, onnx.ModelProto, list[dict[str, np.ndarray]], str]]:
    residual, conv, nested = graphs.residual_add(), graphs.conv_relu(), cf.nested_if()
    return [
        ("residual entropy", residual, graphs.random_batches(residual, 7), "entropy"),
        ("residual ema", residual, graphs.random_batches(residual, 7), "ema"),  # sample sums
        ("conv_relu auto", conv, graphs.random_batches(conv, 7), "auto"),  # in-graph peaks
        # shards where the inner else branch never runs, others where the outer else does
        (
            "nested_if",
            nested,
            cf.batches(nested, 7, outer=lambda k: k % 3 == 0, inner=True),
            "auto",
        ),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case[0])
@pytest.mark.parametrize("shard", [1, 2, 3, 7, 100])
def test_any_shard_size_gives_the_bytes_of_one_pass(case, shard):
    _, model, batches, method = case
    single = quantized_bytes(model, batches, method=method)
    sharded = quantized_bytes(model, batches, method=method, executor=InProcess(shard))
    assert sharded == single


def test_a_folder_is_sharded_into_windows_and_gives_the_same_bytes(calib_dir):
    model = graphs.residual_add()
    folder = calib_dir(model, n=6)
    source = open_source(folder, model_inputs(onnxq.ir.Graph(model)))
    assert isinstance(source, NpzFolder)
    part = source.window(2, 5)
    assert [p.name for p in part.files] == ["0002.npz", "0003.npz", "0004.npz"]
    assert len(source.files) == 6  # the source itself is unchanged
    single = quantized_bytes(model, folder, method="entropy")
    for shard in (1, 4):
        assert quantized_bytes(model, folder, method="entropy", executor=InProcess(shard)) == single


def test_a_generator_is_read_once_in_chunks_with_the_same_bytes():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 9)
    single = quantized_bytes(model, batches)
    reads = []

    def once():
        for k, batch in enumerate(batches):
            reads.append(k)
            yield batch

    assert quantized_bytes(model, once(), executor=InProcess(2)) == single
    assert reads == list(range(9))


def test_max_batches_limits_every_kind_of_shard(calib_dir):
    model = graphs.conv_relu()
    folder = calib_dir(model, n=6)
    single = quantized_bytes(model, folder, max_batches=3)
    assert quantized_bytes(model, folder, max_batches=3, executor=InProcess(2)) == single
    batches = graphs.random_batches(model, 6)
    listed = quantized_bytes(model, batches, max_batches=3)
    assert quantized_bytes(model, batches, max_batches=3, executor=InProcess(2)) == listed


def test_a_bad_batch_in_a_later_shard_names_its_index_as_in_one_process(calib_dir):
    model = graphs.conv_relu()
    folder = calib_dir(model, n=5)
    np.savez(folder / "0003.npz", x=np.zeros((1, 3, 2, 2), np.float32))  # wrong shape
    errors = []
    for executor in (None, InProcess(2)):
        with pytest.raises(CalibrationDataError) as caught:
            quantized_bytes(model, folder, executor=executor)
        errors.append(str(caught.value))
    assert "batch 3" in errors[0]
    assert errors[0] == errors[1]


def test_empty_data_is_the_same_error_sharded():
    model = graphs.conv_relu()
    with pytest.raises(CalibrationDataError, match="yielded no batches"):
        quantized_bytes(model, [], executor=InProcess(2))


def test_the_worker_state_is_made_once_per_context():
    made, seen = [], []

    def setup(context):
        made.append(context)
        return object()

    executor = InProcess()
    context = {"model": 1}
    for _ in range(2):
        seen += list(executor.map(lambda state, shard: (id(state), shard), setup, context, [1, 2]))
    assert made == [context]
    assert len({state for state, _ in seen}) == 1 and [s for _, s in seen] == [1, 2, 1, 2]


class _Fixed:
    def __init__(self, parallelism: int, shard_batches: int | None = None) -> None:
        self.parallelism, self.shard_batches = parallelism, shard_batches


def test_shard_size_follows_the_executor_and_the_data():
    assert shard_size(_Fixed(2, 5), 100) == 5  # the executor's choice wins
    assert shard_size(_Fixed(2), 256) == 32  # four shards per parallel task
    assert shard_size(_Fixed(1), 10_000) == MAX_SHARD  # bounded: memory per chunk
    assert shard_size(_Fixed(4), None) == STREAM_SHARD  # unknown length
    assert shard_size(_Fixed(64), 10) == 1


def test_the_plan_fixes_strides_from_the_whole_calibration_not_a_shard():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 8)
    inputs = model_inputs(onnxq.ir.Graph(model))
    tensors = {"x": True, "conv_out": True}
    whole = plan_calibration(model, tensors, batches, inputs, histogram_budget=32768)
    part = plan_calibration(model, tensors, batches[:2], inputs, histogram_budget=32768)
    assert whole.share < part.share  # the budget spreads over all samples
    assert whole.total == 8
