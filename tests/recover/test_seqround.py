"""Sequential AdaRound: every layer's output error on its inputs in the written (quantized)
model, against the float output, is at most round-to-nearest's, checked with onnxruntime;
numpy and torch agree; the same inputs give the same bytes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from tests.recover.builders import conv_chain
from tests.recover.test_adaround import alone, dequantized_weight, gemm_matmul, smooth_batches


def exposed(m: onnx.ModelProto, tensors: list[str], batches) -> list[list[np.ndarray]]:
    """``tensors`` of ``m`` (run as written: no graph optimisation) on every batch."""
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    del probe.graph.output[:]
    probe.graph.output.extend(
        helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in tensors
    )
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [sess.run(None, b) for b in batches]


def prefix_errors(quant, nearest, float_model, node: str, batches) -> tuple[float, float]:
    """MSE of ``node``'s output against the float model's, on the layer's input in ``quant``
    (everything before it quantized as written), with ``quant``'s weight and with
    ``nearest``'s (round-to-nearest)."""
    f_node = next(n for n in float_model.graph.node if n.name == node)
    q_node = next(n for n in quant.graph.node if n.name == node)
    consts = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    consts = {name: consts[name] for name in f_node.input[1:] if name}
    targets = [y for (y,) in exposed(float_model, [f_node.output[0]], batches)]
    inputs = [x for (x,) in exposed(quant, [q_node.input[0]], batches)]
    errors = []
    for model in (quant, nearest):
        consts[f_node.input[1]] = dequantized_weight(model, node)
        errors.append(
            np.mean(
                [
                    np.mean((alone(f_node, consts, x, float_model.opset_import) - y) ** 2)
                    for x, y in zip(inputs, targets, strict=True)
                ]
            )
        )
    return float(errors[0]), float(errors[1])


@pytest.mark.parametrize(
    "builder", [conv_chain, gemm_matmul], ids=["conv-depthwise", "gemm-matmul"]
)
def test_every_layer_beats_round_to_nearest_on_the_quantized_prefix(builder):
    m = builder()
    batches = smooth_batches(m, n=24)  # half fit the rounding, half judge it
    # high_precision fp32: the rounding is fitted on, and judged against, the Q/DQ graph's
    # float32 arithmetic (recovery runs before the FP16 typing, which is tested in
    # tests/materialize/test_typing.py)
    fp32 = {"progress": False, "high_precision": "fp32"}
    nearest = onnxq.quantize(m, batches, **fp32)
    learned = onnxq.quantize(
        m, batches, adaround=True, adaround_mode="sequential", adaround_steps=300, **fp32
    )
    section = learned.report.to_dict()["recovery"]["adaround"]
    assert section["mode"] == "sequential"
    layers = section["layers"]
    assert [layer["node"] for layer in layers] == [  # every layer with an INT8 weight
        n.name
        for n in learned.model.graph.node
        if n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1].endswith("_dequantized")
    ]
    assert any(layer["kept"] == "learned" for layer in layers)
    for layer in layers:
        assert layer["mse_learned"] <= layer["mse_nearest"] or layer["kept"] == "nearest"
        e_learned, e_near = prefix_errors(learned.model, nearest.model, m, layer["node"], batches)
        assert e_learned <= e_near * (1 + 1e-6), layer["node"]
        if layer["kept"] == "learned":
            assert e_learned < e_near, layer["node"]
    assert check(learned.model, PROFILES["tensorrt"]) == []


def test_a_learned_rounding_stays_only_where_the_model_error_drops():
    m = conv_chain()
    layers = onnxq.quantize(
        m, smooth_batches(m, n=24), adaround=True, adaround_mode="sequential",
        adaround_steps=300, progress=False,
    ).report.to_dict()["recovery"]["adaround"]["layers"]  # fmt: skip
    errors = []
    for layer in layers:
        if layer["model_error_learned"] is None:  # lost on its own judging rows already
            assert layer["kept"] == "nearest" and layer["mse_learned"] >= layer["mse_nearest"]
            continue
        better = layer["model_error_learned"] < layer["model_error_nearest"]
        assert layer["kept"] == ("learned" if better else "nearest")
        errors.append(layer["model_error_learned"] if better else layer["model_error_nearest"])
    assert errors and errors == sorted(errors, reverse=True)  # the model's error never rises


def test_later_layers_see_the_earlier_layers_rounding():
    """The first layer reads the same quantized input in both modes; a later one reads the
    output of learned (not nearest) weights, so its statistics, and its integers, differ."""
    m = conv_chain()
    batches = smooth_batches(m)
    runs = {
        mode: onnxq.quantize(
            m, batches, adaround=True, adaround_mode=mode, adaround_steps=200, progress=False
        ).report.to_dict()["recovery"]["adaround"]["layers"]
        for mode in ("float", "sequential")
    }
    seq = {layer["node"]: layer for layer in runs["sequential"]}
    flt = {layer["node"]: layer for layer in runs["float"]}
    # float mode fits on float inputs: its error has no input-error term; sequential's does
    assert seq["conv2"]["mse_nearest"] > flt["conv2"]["mse_nearest"]


def test_torch_gives_the_same_model_within_tolerance():
    pytest.importorskip("torch")
    m = conv_chain()
    batches = smooth_batches(m)
    runs = [
        onnxq.quantize(
            m,
            batches,
            adaround=True,
            adaround_mode="sequential",
            adaround_steps=200,
            adaround_engine=engine,
            progress=False,
        )
        for engine in ("numpy", "torch")
    ]
    for node in ("conv2", "conv3"):
        a, b = (dequantized_weight(r.model, node) for r in runs)
        assert np.mean(a != b) < 0.02, node
    outs = [exposed(r.model, ["y"], batches[:2]) for r in runs]
    for (x,), (y,) in zip(outs[0], outs[1], strict=True):
        assert np.abs(x - y).max() <= 0.05 * np.abs(x).max()


def test_the_same_inputs_give_the_same_bytes():
    m = gemm_matmul()
    batches = smooth_batches(m)
    runs = [
        onnxq.quantize(
            m, batches, adaround=True, adaround_mode="sequential", adaround_steps=100,
            progress=False,
        ).model.SerializeToString()
        for _ in range(2)
    ]  # fmt: skip
    assert runs[0] == runs[1]


def test_the_flag_turns_adaround_on_in_sequential_mode(tmp_path):
    m = conv_chain()
    model = tmp_path / "model.onnx"
    onnx.save(m, model)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(smooth_batches(m, n=4)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "out.onnx"), "--calib", str(calib)]
    args += ["--report", str(report), "-q", "--adaround-mode", "sequential"]
    assert main([*args, "--set", "recovery.adaround_steps=50"]) == 0
    data = json.loads(report.read_text())
    assert (data["config"]["adaround"], data["config"]["adaround_mode"]) == (True, "sequential")
    assert data["recovery"]["adaround"]["mode"] == "sequential"
    assert len(data["recovery"]["adaround"]["layers"]) == 2  # as placed: conv1 stays float
