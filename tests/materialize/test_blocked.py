"""The weight-only writer: MatMulNBits, GatherBlockQuantized, blocked DequantizeLinear."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnxq.backends.profile import ONNXRUNTIME, TENSORRT
from onnxq.materialize.blocked import WeightOnlyLayer, materialize_weight_only, packed_4bit
from onnxq.numerics.blocks import BlockFormat, quantize_rtn
from tests import graphs
from tests.weightonly import models


def _run(m, feed):
    """Outputs with onnxruntime's graph optimizations off: it would otherwise fuse a blocked
    DequantizeLinear -> MatMul into MatMulNBits with int8 activations (accuracy level 4)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), opts).run(None, feed)[0]


def _with_deq(m, name, value):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for t in out.graph.initializer:
        if t.name == name:
            t.CopyFrom(onnx.numpy_helper.from_array(value, name))
    return out


_ORT_FORMATS = [
    BlockFormat(4, 32, True),
    BlockFormat(4, 64, True),
    BlockFormat(4, 32, False),
    BlockFormat(8, 32, True),
    BlockFormat(8, None, True),
]
_TRT_FORMATS = [BlockFormat(4, 64, True), BlockFormat(4, 128, True), BlockFormat(8, None, True)]


@pytest.mark.parametrize(
    ("profile", "fmt"),
    [(ONNXRUNTIME, f) for f in _ORT_FORMATS] + [(TENSORRT, f) for f in _TRT_FORMATS],
)
def test_matmul_computes_the_dequantized_weight(profile, fmt):
    k = 72 if profile is ONNXRUNTIME else 128  # 72: a short last block
    m = models.linear(k=k, n=40)
    w = onnx.numpy_helper.to_array(m.graph.initializer[0])
    codes = quantize_rtn(w, fmt)
    q = onnx.ModelProto()
    q.CopyFrom(m)
    materialize_weight_only(q, [WeightOnlyLayer("fc", "w", codes)], profile, accuracy_level=0)
    x = np.random.default_rng(0).standard_normal((5, k)).astype(np.float32)
    want = _run(_with_deq(m, "w", codes.dequantize()), {"x": x})
    np.testing.assert_allclose(_run(q, {"x": x}), want, rtol=1e-4, atol=1e-4)
    ops = [n.op_type for n in q.graph.node]
    assert ops == (
        ["MatMulNBits"]
        if profile is ONNXRUNTIME and fmt.block_size
        else ["DequantizeLinear", "MatMul"]
    )
    assert not any(t.name == "w" for t in q.graph.initializer)  # the float weight is gone


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("profile", [ONNXRUNTIME, TENSORRT])
def test_gemm_keeps_alpha_beta_and_bias(trans_b, profile):
    r = graphs.rng(3)
    k, n = 64, 24
    w = graphs.weight(r, n, k) if trans_b else graphs.weight(r, k, n)
    node = helper.make_node(
        "Gemm", ["x", "w", "c"], ["y"], name="gemm", transB=trans_b, alpha=0.5, beta=2.0
    )
    m = graphs.model(
        [node],
        [graphs.tensor("x", ["rows", k])],
        [graphs.tensor("y", ["rows", n])],
        [graphs.init("w", w), graphs.init("c", graphs.weight(r, n))],
        opset=21,
    )
    w_kn = w.T if trans_b else w
    codes = quantize_rtn(w_kn, BlockFormat(4, 64, True))
    q = onnx.ModelProto()
    q.CopyFrom(m)
    materialize_weight_only(q, [WeightOnlyLayer("gemm", "w", codes)], profile, 0)
    deq = codes.dequantize()
    x = r.standard_normal((3, k)).astype(np.float32)
    want = _run(_with_deq(m, "w", deq.T.copy() if trans_b else deq), {"x": x})
    np.testing.assert_allclose(_run(q, {"x": x}), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "fmt", [BlockFormat(4, 32, True), BlockFormat(4, 32, False), BlockFormat(8, 32, True)]
)
def test_embedding_becomes_gather_block_quantized(fmt):
    m = models.decoder()
    table = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "embed"))
    codes = quantize_rtn(table.T, fmt)  # K = the row (hidden) axis
    q = onnx.ModelProto()
    q.CopyFrom(m)
    materialize_weight_only(q, [WeightOnlyLayer("embedding", "embed", codes)], ONNXRUNTIME)
    assert "GatherBlockQuantized" in [n.op_type for n in q.graph.node]
    feed = models.token_batches(1)[0]
    want = _run(_with_deq(m, "embed", codes.dequantize().T.copy()), feed)
    np.testing.assert_allclose(_run(q, feed), want, rtol=1e-4, atol=1e-4)


def test_a_shared_weight_is_stored_once():
    r = graphs.rng(4)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="fc_a"),
        helper.make_node("Relu", ["x"], ["a2"], name="relu"),
        helper.make_node("MatMul", ["a2", "w"], ["b"], name="fc_b"),
    ]
    m = graphs.model(
        nodes,
        [graphs.tensor("x", ["rows", 32])],
        [graphs.tensor("a", ["rows", 32]), graphs.tensor("b", ["rows", 32])],
        [graphs.init("w", graphs.weight(r, 32, 32))],
        opset=21,
    )
    codes = quantize_rtn(
        onnx.numpy_helper.to_array(m.graph.initializer[0]), BlockFormat(4, 32, True)
    )
    materialize_weight_only(
        m, [WeightOnlyLayer("fc_a", "w", codes), WeightOnlyLayer("fc_b", "w", codes)], ONNXRUNTIME
    )
    blobs = [t for t in m.graph.initializer if t.name.endswith("_nbits")]
    assert len(blobs) == 1


def test_packed_4bit_puts_the_first_code_in_the_low_nibble():
    t = packed_4bit("t", np.array([[1, -2, 7]]), signed=True)
    assert t.data_type == onnx.TensorProto.INT4 and list(t.dims) == [1, 3]
    assert t.raw_data == bytes([0x01 | (0xE << 4), 0x07])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), [[1, -2, 7]])


def test_input_scales_go_into_a_mul_when_the_input_is_not_a_constant_scaled_one():
    m = models.linear(k=32, n=16)
    w = onnx.numpy_helper.to_array(m.graph.initializer[0])
    s = np.linspace(0.5, 2.0, 32).astype(np.float32)
    codes = quantize_rtn(w * s[:, None], BlockFormat(4, 32, True))
    q = onnx.ModelProto()
    q.CopyFrom(m)
    materialize_weight_only(q, [WeightOnlyLayer("fc", "w", codes, s)], ONNXRUNTIME, 0)
    assert [n.op_type for n in q.graph.node] == ["Mul", "MatMulNBits"]
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    want = _run(_with_deq(m, "w", codes.dequantize() / s[:, None]), {"x": x})
    np.testing.assert_allclose(_run(q, {"x": x}), want, rtol=1e-4, atol=1e-4)


def test_input_scales_fold_into_a_layer_normalization():
    r = graphs.rng(6)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="ln", axis=-1),
        helper.make_node("MatMul", ["n", "w"], ["y"], name="fc"),
    ]
    m = graphs.model(
        nodes,
        [graphs.tensor("x", ["rows", 32])],
        [graphs.tensor("y", ["rows", 16])],
        [
            graphs.init("gamma", r.random(32).astype(np.float32) + 0.5),
            graphs.init("beta", graphs.weight(r, 32)),
            graphs.init("w", graphs.weight(r, 32, 16)),
        ],
        opset=21,
    )
    w = onnx.numpy_helper.to_array(m.graph.initializer[2])
    s = np.linspace(0.5, 2.0, 32).astype(np.float32)
    codes = quantize_rtn(w * s[:, None], BlockFormat(4, 32, True))
    q = onnx.ModelProto()
    q.CopyFrom(m)
    materialize_weight_only(q, [WeightOnlyLayer("fc", "w", codes, s)], ONNXRUNTIME, 0)
    assert [n.op_type for n in q.graph.node] == ["LayerNormalization", "MatMulNBits"]
    x = r.standard_normal((4, 32)).astype(np.float32)
    want = _run(_with_deq(m, "w", codes.dequantize() / s[:, None]), {"x": x})
    np.testing.assert_allclose(_run(q, {"x": x}), want, rtol=1e-4, atol=1e-4)
