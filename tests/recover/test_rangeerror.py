"""What the range search measures: the float outputs it keeps, the model cut after one
activation, each candidate's per-sample output error, and numpy's Q/DQ."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.calibrate.session import make_session
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.numerics.qparams import range_to_qparams
from onnxq.recover.rangeerror import FloatOutputs, SuffixRunner, fake_quantize, sample_errors
from onnxq.recover.rangegrid import Candidate
from tests.graphs import init, model, residual_add, tensor
from tests.recover.builders import conv_chain, image_batches

# high_precision fp32: the range search scores candidates on the FP32 Q/DQ graph (it runs
# before the FP16 typing), and its score is compared to the written model's
SETTINGS = {"progress": False, "min_channels": 0, "fidelity_batches": 2, "high_precision": "fp32"}


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


def _calibration(cfg: QuantConfig):

    return cfg.calibration


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


def test_padded_positions_are_left_out_of_the_error():
    want = np.ones((1, 3, 2))
    got = want.copy()
    got[0, 2] = 50.0  # a padded position
    mask = np.array([[True, True, False]])
    assert sample_errors(got, want, mask).tolist() == [0.0]
    assert sample_errors(got, want)[0] > 100
    # an output the mask does not fit (a pooled embedding) is compared whole
    assert sample_errors(got[:, 0], want[:, 0], mask).tolist() == [0.0]
