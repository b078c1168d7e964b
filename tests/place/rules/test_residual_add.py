"""The ``residual_add`` rule: which producers make an Add a fusable residual (profile data).

TensorRT fuses a residual Add into a Conv/ConvTranspose epilogue and ModelOpt places the skip
input's Q/DQ only there; the Add after a MatMul/Gemm is a transformer's residual stream, which
stays float.  The Conv side (``tests/graphs.residual_add``) is in ``test_rules.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.profile import PROFILES
from tests import graphs
from tests.placement import annotate_graph, annotated

WIDTH = 64


def matmul_residual(op_type: str = "MatMul", seed: int = 0) -> onnx.ModelProto:
    """A transformer's residual: h = x @ W (MatMul, or Gemm with transB); y = Add(h, x)."""
    r = graphs.rng(seed)
    attrs = {"transB": 1} if op_type == "Gemm" else {}
    shape = [1, 8, WIDTH] if op_type == "MatMul" else [8, WIDTH]
    nodes = [
        helper.make_node(op_type, ["x", "proj.weight"], ["h"], name="proj", **attrs),
        helper.make_node("Add", ["h", "x"], ["y"], name="add"),
    ]
    inits = [graphs.init("proj.weight", graphs.weight(r, WIDTH, WIDTH))]
    return graphs.model(
        nodes, [graphs.tensor("x", shape)], [graphs.tensor("y", shape)], inits, name="mm_res"
    )


def conv_transpose_residual(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """h = ConvTranspose(x) (3x3, stride 1, pads 1: same size); y = Add(h, x)."""
    r = graphs.rng(seed)
    nodes = [
        helper.make_node("ConvTranspose", ["x", "ct.weight"], ["h"], name="ct", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["h", "x"], ["y"], name="add"),
    ]
    shape = [1, channels, 8, 8]
    inits = [graphs.init("ct.weight", graphs.weight(r, channels, channels, 3, 3))]
    return graphs.model(
        nodes, [graphs.tensor("x", shape)], [graphs.tensor("y", shape)], inits, name="ct_res"
    )


def decision(model: onnx.ModelProto, node: str, **options):
    (found,) = [d for d in annotated(model, **options).decisions if d.node == node]
    return found


def test_tensorrt_residual_producers_are_conv_and_conv_transpose_only():
    assert PROFILES["tensorrt"].residual_producers == frozenset({"Conv", "ConvTranspose"})


def test_matmul_residual_stream_stays_float():
    d = decision(matmul_residual(), "add")
    assert not d.quantized and d.rule == "residual_add"
    assert d.reason == (
        "neither input comes straight from a quantized Conv/ConvTranspose, so the Add "
        "cannot fuse as a residual; it stays float"
    )
    assert decision(matmul_residual(), "proj").quantized  # the MatMul itself keeps INT8


def test_gemm_residual_stays_float():
    d = decision(matmul_residual("Gemm"), "add")
    assert decision(matmul_residual("Gemm"), "proj").quantized
    assert not d.quantized and d.rule == "residual_add"


def test_conv_transpose_residual_quantizes_the_skip_input():
    ann = annotated(conv_transpose_residual())
    (d,) = [d for d in ann.decisions if d.node == "add"]
    assert d.quantized and d.rule == "residual_add" and d.tensors == ("x",)
    assert ann.tensors["x"].consumers == [("ct", 0), ("add", 1)]
    assert "h" not in ann.tensors


def test_the_producers_are_profile_data():
    graph = ir.Graph(ir.infer_shapes(matmul_residual()))
    profile = PROFILES["tensorrt"].replace(residual_producers=frozenset({"MatMul"}))
    (d,) = [d for d in annotate_graph(graph, profile).decisions if d.node == "add"]
    assert d.quantized and d.tensors == ("x",)


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options)
    return session.run(None, {"x": x})


def test_quantized_matmul_residual_adds_the_outlier_stream_back_exactly():
    # a residual stream with one outlier channel (LLMs' massive activations): one per-tensor
    # scale on the skip would zero every other channel; the float skip adds x back exactly
    m = matmul_residual()
    r = graphs.rng(1)
    batches = []
    for _ in range(3):
        x = r.standard_normal((1, 8, WIDTH)).astype(np.float32)
        x[..., 3] *= 300.0
        batches.append({"x": x})
    # high_precision fp32: "exactly" is float32's; the default FP16 Add would round the
    # outlier channel's values (up to ~500) to FP16's steps there (0.25 and 0.5)
    out = onnxq.quantize(m, batches, backend="tensorrt", progress=False, high_precision="fp32")
    out = out.model
    assert graphs.count_ops(out, "QuantizeLinear") == 1  # the MatMul's activation input only
    out.graph.output.append(graphs.tensor("h", [1, 8, WIDTH]))  # the quantized MatMul's output
    x = batches[0]["x"]
    y, h = _run(out, x)
    np.testing.assert_allclose(y - h, x, rtol=0, atol=1e-3)
