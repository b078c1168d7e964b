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


def layer_error(quant: onnx.ModelProto, float_model: onnx.ModelProto, node: str, batches) -> float:
    """Mean squared error of ``node``'s output in ``quant`` against the float model, both fed
    the float model's input to that node (the quantity AdaRound minimises)."""
    q_node = next(n for n in quant.graph.node if n.name == node)
    f_node = next(n for n in float_model.graph.node if n.name == node)
    w_dq = next(n for n in quant.graph.node if n.output[0] == q_node.input[1])
    inits = {t.name: numpy_helper.to_array(t) for t in quant.graph.initializer}
    q = inits[w_dq.input[0]].astype(np.float32)
    s = inits[w_dq.input[1]]
    axis = next((a.i for a in w_dq.attribute if a.name == "axis"), 1)
    shape = [1] * q.ndim
    shape[axis] = -1
    w_q = q * s.reshape(shape)
    x_name = f_node.input[0]
    feed_model = onnx.ModelProto()
    feed_model.CopyFrom(float_model)
    del feed_model.graph.output[:]
    feed_model.graph.output.extend(
        [
            helper.make_tensor_value_info(x_name, 1, None),
            helper.make_tensor_value_info(f_node.output[0], 1, None),
        ]
    )
    sess = ort.InferenceSession(feed_model.SerializeToString(), providers=["CPUExecutionProvider"])
    one = onnx.ModelProto()
    one.CopyFrom(float_model)
    for t in one.graph.initializer:
        if t.name == f_node.input[1]:
            t.CopyFrom(numpy_helper.from_array(w_q, t.name))
    del one.graph.output[:]
    one.graph.output.append(helper.make_tensor_value_info(f_node.output[0], 1, None))
    total = count = 0.0
    for batch in batches:
        x, y = sess.run(None, batch)
        one_node = next(n for n in one.graph.node if n.name == node)
        one.graph.input[0].name  # the layer alone: feed x to it through a tiny model
        layer = helper.make_model(
            helper.make_graph(
                [
                    helper.make_node(
                        one_node.op_type,
                        ["xin", *one_node.input[1:]],
                        ["yout"],
                        **{a.name: helper.get_attribute_value(a) for a in one_node.attribute},
                    )
                ],
                "layer",
                [helper.make_tensor_value_info("xin", 1, list(x.shape))],
                [helper.make_tensor_value_info("yout", 1, None)],
                [t for t in one.graph.initializer if t.name in one_node.input[1:]],
            ),
            opset_imports=float_model.opset_import,
        )
        layer.ir_version = float_model.ir_version
        got = ort.InferenceSession(
            layer.SerializeToString(), providers=["CPUExecutionProvider"]
        ).run(None, {"xin": x})[0]
        total += float(((got - y) ** 2).sum())
        count += y.size
    return total / count


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
    runs = [
        onnxq.quantize(
            m, batches, adaround=True, adaround_steps=200, weight_storage=s, progress=False
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
