"""Dynamic kernels written from the dynamic rules, checked against onnxruntime: the float model
and onnxruntime's own ``quantize_dynamic`` on the same graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq.materialize import read_metadata
from tests import graphs


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnxq.quantize(model, backend="onnxruntime", dynamic=True).model


def ort_dynamic(model: onnx.ModelProto, tmp_path, **options) -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    src, dst = tmp_path / "float.onnx", tmp_path / "ort.onnx"
    onnx.save(model, src)
    quantize_dynamic(src, dst, **options)
    return onnx.load(dst)


def test_matmuls_become_dynamic_kernels_closer_to_float_than_onnxruntimes(tmp_path):
    m = graphs.matmul_stack()
    w1 = next(t for t in m.graph.initializer if t.name == "w1")
    loud = onnx.numpy_helper.to_array(w1).copy()
    loud[:, :8] *= 30  # a few loud output columns: one per-tensor scale rounds the rest away
    w1.CopyFrom(onnx.numpy_helper.from_array(loud, "w1"))
    x = np.random.default_rng(3).normal(0, 1, (4, 8, 128)).astype(np.float32)
    ours = dynamic(m)
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 2 and "MatMul" in ops  # the scores stay float
    ref, mine = run(m, {"x": x}), run(ours, {"x": x})
    theirs = run(ort_dynamic(m, tmp_path), {"x": x})  # its default: per-tensor weights
    assert cosine(mine[0], ref[0]) > 0.999
    assert 1 - cosine(mine[0], ref[0]) < 0.5 * (1 - cosine(theirs[0], ref[0]))
    np.testing.assert_array_equal(mine[1], ref[1])


@pytest.mark.parametrize("trans_b", [True, False])
def test_a_gemm_folds_alpha_beta_and_its_bias(trans_b):
    m = graphs.gemm(trans_b=trans_b, k=128, n=64)
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    gemm.attribute.extend(
        [onnx.helper.make_attribute("alpha", 0.5), onnx.helper.make_attribute("beta", 2.0)]
    )
    x = np.random.default_rng(0).normal(0, 1, (2, 128)).astype(np.float32)
    ours = dynamic(m)
    assert [n.op_type for n in ours.graph.node] == ["DynamicQuantizeMatMul", "Relu"]
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_a_matmuls_bias_add_goes_into_the_kernel():
    r = graphs.rng(0)
    m = graphs.model(
        [
            onnx.helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
            onnx.helper.make_node("Add", ["mm", "b"], ["y"], name="bias"),
            onnx.helper.make_node("Relu", ["y"], ["out"], name="relu"),
        ],
        [graphs.tensor("x", [2, 8, 128])],
        [graphs.tensor("out", [2, 8, 96])],
        [graphs.init("w", graphs.weight(r, 128, 96)), graphs.init("b", graphs.weight(r, 96))],
    )
    result = onnxq.quantize(m, backend="onnxruntime", dynamic=True)
    ours = result.model
    assert [n.op_type for n in ours.graph.node] == ["DynamicQuantizeMatMul", "Relu"]
    assert len(ours.graph.node[0].input) == 5  # A, B, scale, zero point, bias
    assert {d.node: d.rule for d in result.report.decisions}["bias"] == "fused"
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 128)).astype(np.float32)
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_an_input_several_matmuls_read_is_quantized_once():
    from onnxq.backends.check import check
    from onnxq.backends.profile import ONNXRUNTIME

    r = graphs.rng(1)
    nodes = [
        onnx.helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)
    ]
    inits = [graphs.init(f"w{i}", graphs.weight(r, 128, 64)) for i in range(3)]
    outs = [graphs.tensor(f"y{i}", [2, 8, 64]) for i in range(3)]
    m = graphs.model(nodes, [graphs.tensor("x", [2, 8, 128])], outs, inits)
    ours = dynamic(m)
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeLinear") == 1 and ops.count("MatMulIntegerToFloat") == 3
    assert check(ours, ONNXRUNTIME) == []
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 128)).astype(np.float32)
    for mine, ref in zip(run(ours, {"x": x}), run(m, {"x": x}), strict=True):
        assert cosine(mine, ref) > 0.999


def test_an_lstm_becomes_dynamic_quantize_lstm_close_to_float():
    m = graphs.recurrent("LSTM", features=64, hidden=64)
    x = np.random.default_rng(1).normal(0, 1, (20, 2, 64)).astype(np.float32)
    ours = dynamic(m)
    assert ours.graph.node[0].op_type == "DynamicQuantizeLSTM"
    w = next(t for t in ours.graph.initializer if t.name.startswith("rnn.W_quantized"))
    assert list(w.dims) == [1, 64, 256] and w.data_type == onnx.TensorProto.INT8  # transposed
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_a_gru_stays_float_and_its_matmul_does_not():
    m = graphs.recurrent("GRU")
    ours = dynamic(m)
    assert [n.op_type for n in ours.graph.node][:1] == ["GRU"]
    assert "DynamicQuantizeMatMul" in [n.op_type for n in ours.graph.node]


def test_metadata_marks_activations_quantized_at_run_time():
    records = read_metadata(dynamic(graphs.matmul_stack()))
    assert records is not None
    assert records["x"]["runtime"] is True and records["x"]["dtype"] == "uint8"
    assert records["x"]["symmetric"] is False
    assert (records["w1"]["dtype"], records["w1"]["bits"], records["w1"]["axis"]) == ("int8", 8, 1)


def test_the_same_input_gives_the_same_bytes():
    m = graphs.recurrent("LSTM")
    assert dynamic(m).SerializeToString() == dynamic(m).SerializeToString()
