"""AdaRound in the pipeline: every Conv/Gemm/MatMul layer's output error on the calibration
data is below round-to-nearest's, checked with onnxruntime on the written model, and the
model still passes the backend's check."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import conv_chain, image_batches


def gemm_matmul(seed: int = 0) -> onnx.ModelProto:
    """``x -> Gemm(transB) -> Relu -> MatMul -> y`` with correlated inputs' worth of width."""
    r = rng(seed)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="gemm", transB=1),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["y"], name="matmul"),
    ]
    inits = [
        init("w1", weight(r, 48, 32)),
        init("b1", weight(r, 48)),
        init("w2", weight(r, 48, 24)),
    ]
    return model(nodes, [tensor("x", [16, 32])], [tensor("y", [16, 24])], inits)


def smooth_batches(m: onnx.ModelProto, n: int = 8) -> list[dict[str, np.ndarray]]:
    """Inputs with neighbouring values correlated (as in images and features)."""
    out = []
    for b in image_batches(m, n=n):
        ((name, x),) = b.items()
        out.append({name: (x + np.roll(x, 1, axis=-1) + np.roll(x, 2, axis=-1)).astype(np.float32)})
    return out


def dequantized_weight(quant: onnx.ModelProto, node: str) -> np.ndarray:
    """The weight ``node`` computes with in the quantized model (its DequantizeLinear)."""
    reader = next(n for n in quant.graph.node if n.name == node)
    dq = next(n for n in quant.graph.node if n.output[0] == reader.input[1])
    inits = {t.name: numpy_helper.to_array(t) for t in quant.graph.initializer}
    q, scale = inits[dq.input[0]].astype(np.float32), inits[dq.input[1]]
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    shape = [1] * q.ndim
    shape[axis] = -1
    return q * scale.reshape(shape)


def alone(node: onnx.NodeProto, consts: dict[str, np.ndarray], x: np.ndarray, opset) -> np.ndarray:
    """``node`` by itself, run by onnxruntime on input ``x`` with constant inputs ``consts``."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    graph = helper.make_graph(
        [helper.make_node(node.op_type, ["x", *node.input[1:]], ["y"], **attrs)],
        "alone",
        [tensor("x", list(x.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [init(name, value) for name, value in consts.items()],
    )
    m = helper.make_model(graph, opset_imports=opset)
    m.ir_version = 8
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def layer_error(quant: onnx.ModelProto, float_model: onnx.ModelProto, node: str, batches) -> float:
    """Mean squared error of ``node``'s output with the quantized model's weight against the
    float model's output, both on the float model's input to it (what AdaRound minimises)."""
    f_node = next(n for n in float_model.graph.node if n.name == node)
    consts = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    consts = {name: consts[name] for name in f_node.input[1:] if name}
    consts[f_node.input[1]] = dequantized_weight(quant, node)
    probe = onnx.ModelProto()
    probe.CopyFrom(float_model)
    del probe.graph.output[:]
    probe.graph.output.extend(
        helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
        for t in (f_node.input[0], f_node.output[0])
    )
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    errors = []
    for batch in batches:
        x, y = sess.run(None, batch)
        errors.append(np.mean((alone(f_node, consts, x, float_model.opset_import) - y) ** 2))
    return float(np.mean(errors))


@pytest.mark.parametrize(
    "builder", [conv_chain, gemm_matmul], ids=["conv-depthwise", "gemm-matmul"]
)
def test_every_layer_beats_round_to_nearest(builder):
    m = builder()
    batches = smooth_batches(m)
    nearest = onnxq.quantize(m, batches, progress=False)
    learned = onnxq.quantize(m, batches, adaround=True, adaround_steps=500, progress=False)
    layers = learned.report.to_dict()["recovery"]["adaround"]["layers"]
    assert layers and all(layer["kept"] == "learned" for layer in layers)
    for layer in layers:
        assert layer["mse_learned"] < layer["mse_nearest"]
        e_near = layer_error(nearest.model, m, layer["node"], batches)
        e_learned = layer_error(learned.model, m, layer["node"], batches)
        assert e_learned < e_near, layer["node"]


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
@pytest.mark.parametrize("storage", ["int8", "qdq"])
def test_adaround_models_pass_check_in_both_storages(backend, storage):
    m = conv_chain()
    batches = smooth_batches(m)
    result = onnxq.quantize(
        m,
        batches,
        backend=backend,
        adaround=True,
        adaround_steps=200,
        weight_storage=storage,
        progress=False,
    )
    assert check(result.model, PROFILES[backend]) == []
    assert result.report.to_dict()["recovery"]["adaround"]["layers"]


def test_qdq_storage_holds_the_same_integers_as_int8_storage():
    m = gemm_matmul()
    batches = smooth_batches(m)
    # high_precision fp32: the same integers give the same float32 outputs; in FP16,
    # onnxruntime's Gemm rounds the two graphs' equal inputs apart (its accumulation order)
    runs = [
        onnxq.quantize(
            m,
            batches,
            adaround=True,
            adaround_steps=200,
            weight_storage=s,
            progress=False,
            high_precision="fp32",
        )
        for s in ("int8", "qdq")
    ]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    outs = [
        ort.InferenceSession(
            r.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        ).run(None, batches[0])[0]
        for r in runs
    ]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
