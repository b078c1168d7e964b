"""SmoothQuant: exact in float wherever the 1/s goes (a LayerNorm, an RMSNorm's constant, a
product's factor, a MatMul's columns, an inserted Mul), and it narrows the channel spread."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.data.inputs import model_inputs
from onnxq.recover.smoothquant import smooth
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import layernorm_block, outlier_batches, rmsnorm_swiglu


def run(m: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, b)[0] for b in batches])


def smoothed(m: onnx.ModelProto, tensors: list[str], alpha: float = 0.5):
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    batches = outlier_batches([2, 6, 16])
    out, done = smooth(copy, tensors, batches, model_inputs(ir.Graph(copy)), alpha, progress=False)
    onnx.checker.check_model(out)
    ref, got = run(m, batches), run(out, batches)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), "not exact"
    return out, {d.tensor: d for d in done}


def matmul_bias_matmul(k: int = 16, seed: int = 0) -> onnx.ModelProto:
    """``x -> MatMul -> Add(bias) -> MatMul -> y``."""
    r = rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1_bias"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2"),
    ]
    b1 = weight(r, k)
    b1[2] = 20.0  # an outlier channel
    inits = [init("w1", weight(r, k, k)), init("b1", b1), init("w2", weight(r, k, k))]
    return model(nodes, [tensor("x", [2, 6, k])], [tensor("y", [2, 6, k])], inits)


def test_layernorm_absorbs_the_scale():
    out, done = smoothed(layernorm_block(), ["ln"])
    assert done["ln"].folded_into == "scale and bias of ln"
    assert done["ln"].readers == ("q_proj", "v_proj")
    assert done["ln"].spread_after < done["ln"].spread_before
    assert [n.op_type for n in out.graph.node].count("Mul") == 0


def test_a_tensor_with_another_reader_gets_a_mul():
    out, done = smoothed(layernorm_block(residual=True), ["ln"])
    assert done["ln"].folded_into.startswith("inserted ")
    # the residual still reads the unscaled LayerNorm output
    residual = next(n for n in out.graph.node if n.name == "residual")
    assert "ln" in residual.input


def test_rmsnorm_constant_and_swiglu_factor_absorb_the_scale():
    _, done = smoothed(rmsnorm_swiglu(), ["normed", "prod"])
    assert done["normed"].folded_into == "Mul constant of rms_weight"
    assert done["normed"].readers == ("gate_proj", "up_proj")
    assert done["prod"].folded_into == "output columns of up_proj (a factor of swiglu)"


def test_matmul_columns_and_bias_absorb_the_scale():
    _, done = smoothed(matmul_bias_matmul(), ["h"])
    assert done["h"].folded_into == "output columns of fc1 and the bias of fc1_bias"
    assert done["h"].spread_after < done["h"].spread_before


def test_alpha_one_moves_all_of_the_spread():
    _, done = smoothed(matmul_bias_matmul(), ["h"], alpha=1.0)
    assert done["h"].spread_after == pytest.approx(1.0)


def test_a_tensor_without_constant_weight_readers_is_left_alone():
    m = layernorm_block()
    _, done = smoothed(m, ["q"])  # read by an Add, not a MatMul
    assert done == {}


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_quantize_with_smoothquant_passes_check_and_helps(backend):
    m = rmsnorm_swiglu(k=64, hidden=128, tokens=16)  # large enough for onnxruntime's rules
    batches = outlier_batches([2, 16, 64], n=16)
    plain = onnxq.quantize(m, batches, backend=backend, progress=False)
    smooth_ = onnxq.quantize(
        m, batches, backend=backend, smoothquant=0.5, smoothquant_min_spread=1.0, progress=False
    )
    assert check(smooth_.model, PROFILES[backend]) == []
    section = smooth_.report.to_dict()["recovery"]["smoothquant"]
    assert section["alpha"] == 0.5
    assert {t["tensor"] for t in section["tensors"]} == {"normed", "prod"}
    assert smooth_.report.fidelity[0].cosine > plain.report.fidelity[0].cosine


def test_inputs_without_outlier_channels_are_left_alone():
    m = rmsnorm_swiglu(k=64, hidden=128, tokens=16)
    batches = outlier_batches([2, 16, 64], n=16)
    every = onnxq.quantize(m, batches, smoothquant=0.8, smoothquant_min_spread=1.0, progress=False)
    spreads = {
        t["tensor"]: t["spread_before"]
        for t in every.report.to_dict()["recovery"]["smoothquant"]["tensors"]
    }
    threshold = (spreads["normed"] + spreads["prod"]) / 2  # between the two inputs' spreads
    assert spreads["normed"] > threshold > spreads["prod"]
    some = onnxq.quantize(
        m, batches, smoothquant=0.8, smoothquant_min_spread=threshold, progress=False
    )
    section = some.report.to_dict()["recovery"]["smoothquant"]
    assert [t["tensor"] for t in section["tensors"]] == ["normed"]
    assert section["candidates"] == 2


def test_a_reader_of_the_shape_only_does_not_stop_the_fold():
    """Hugging Face attention reads ``hidden_states.shape`` from the normed tensor that q/k/v
    read (a TorchScript export: ``Shape`` nodes next to the projections); the shape does not
    change with the scale, so the LayerNorm still absorbs it instead of an inserted Mul."""
    m = layernorm_block()
    graph = m.graph
    at = next(i for i, n in enumerate(graph.node) if n.name == "join")
    graph.node[at].input[0] = "q_shaped"
    graph.node.insert(at, helper.make_node("Reshape", ["q", "ln_shape"], ["q_shaped"]))
    graph.node.insert(at, helper.make_node("Shape", ["ln"], ["ln_shape"], name="attn_shape"))
    out, done = smoothed(m, ["ln"])
    assert done["ln"].folded_into == "scale and bias of ln"
    assert [n.op_type for n in out.graph.node].count("Mul") == 0
