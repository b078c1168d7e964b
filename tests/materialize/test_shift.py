"""The half-range shift of non-negative activations (``shift_activations``): exact in float
(the Sub, the Pad and the folded biases give the model's outputs back with the activations'
Q/DQ taken out), twice the steps over the same range, a lower output error, a model TensorRT's
checker accepts, and the same bytes run to run."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import conv_act_conv, conv_chain, image_batches

# high_precision fp32: the shift's exactness is a float32 identity (the Sub, the Pad and the
# folded biases against the activations' Q/DQ taken out); FP16 typing is tested in
# tests/materialize/test_typing.py
COMMON = {
    "backend": "tensorrt",
    "progress": False,
    "min_channels": 0,
    "weak_channel_fraction": 1.0,
    "high_precision": "fp32",
}


def run(m: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, b)[0] for b in batches])


def without_activation_qdq(m: onnx.ModelProto, only: set[str] | None = None) -> onnx.ModelProto:
    """``m`` with every activation's QuantizeLinear -> DequantizeLinear taken out (``only``:
    those of these tensors); weights stay as they are quantized."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    consts = {t.name for t in g.initializer}
    q_input = {n.output[0]: n.input[0] for n in g.node if n.op_type == "QuantizeLinear"}
    rename, drop = {}, []
    for n in g.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in consts:
            if only is None or n.input[0] in only:
                drop.append(n.name)
        elif n.op_type == "DequantizeLinear" and n.input[0] in q_input:
            source = q_input[n.input[0]]
            if source not in consts and (only is None or source in only):
                rename[n.output[0]] = q_input[n.input[0]]
                drop.append(n.name)
    kept = [n for n in g.node if n.name not in drop]
    for n in kept:
        for i, name in enumerate(n.input):
            n.input[i] = rename.get(name, name)
    del g.node[:]
    g.node.extend(kept)
    return out


def ops(m: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if n.op_type == op_type]


def relu_gemm(bias: bool, trans_b: int, seed: int = 0) -> onnx.ModelProto:
    """``x -> Gemm -> Relu -> Gemm (bias or none, transB) -> y``."""
    r = rng(seed)
    w1, b1 = weight(r, 32, 24, scale=0.3), weight(r, 32, scale=0.3)
    w2 = weight(r, 16, 32) if trans_b else weight(r, 32, 16)
    inputs = ["h", "w2"] + (["b2"] if bias else [])
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["g1"], name="fc1", transB=1),
        helper.make_node("Relu", ["g1"], ["h"], name="relu"),
        helper.make_node("Gemm", inputs, ["y"], name="fc2", transB=trans_b),
    ]
    inits = [init("w1", w1), init("b1", b1), init("w2", w2)]
    if bias:
        inits.append(init("b2", weight(r, 16)))
    return model(nodes, [tensor("x", [4, 24])], [tensor("y", [4, 16])], inits)


GRAPHS = {
    "relu -> 1x1 conv and relu -> padded depthwise conv": conv_chain,
    "relu6 -> padded depthwise conv without bias": lambda: conv_act_conv("Clip", 16),
    "relu -> gemm transB with bias": lambda: relu_gemm(True, 1),
    "relu -> gemm without bias": lambda: relu_gemm(False, 0),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_shift_is_exact_in_float_and_halves_the_step(name):
    m = GRAPHS[name]()
    batches = image_batches(m)
    plain = onnxq.quantize(m, batches, **COMMON)
    shifted = onnxq.quantize(m, batches, shift_activations=True, **COMMON)
    subs = ops(shifted.model, "Sub")
    assert subs, "nothing was shifted"
    # the Sub, the Pad and the biases give back what the same quantized weights compute
    fresh = image_batches(m, n=3, seed=9, scale=2.0)
    ref = run(without_activation_qdq(plain.model), fresh)
    got = run(without_activation_qdq(shifted.model), fresh)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    # the same range, twice the steps
    before = {t["tensor"]: t for t in plain.report.to_dict()["quantized_tensors"]}
    after = {t["tensor"]: t for t in shifted.report.to_dict()["quantized_tensors"]}
    moved = [t for t in after.values() if "shift_activations" in t.get("note", "")]
    assert len(moved) == len(subs)
    for t in moved:
        assert t["scale"] == pytest.approx(before[t["tensor"]]["scale"] / 2, rel=1e-6)
        assert t["range"] == before[t["tensor"]]["range"]
    assert check(shifted.model, PROFILES["tensorrt"]) == []


def test_the_default_fp16_output_shifts_too_and_the_checker_accepts_it():
    """tensorrt's default output computes the float ops in FP16: the Sub and the Pad are
    typed with them, the output passes the strongly typed checker, and it computes what the
    FP32 output computes up to FP16's rounding."""
    m = conv_chain()
    batches = image_batches(m)
    fp16 = {**COMMON, "high_precision": None}  # the backend's choice: fp16
    low = onnxq.quantize(m, batches, shift_activations=True, **fp16).model
    high = onnxq.quantize(m, batches, shift_activations=True, **COMMON).model
    consts = {t.name: t.data_type for t in low.graph.initializer}
    for sub in ops(low, "Sub"):
        assert consts[sub.input[1]] == onnx.TensorProto.FLOAT16
    assert check(low, PROFILES["tensorrt"]) == []
    fresh = image_batches(m, n=3, seed=9)
    ref, got = run(high, fresh), run(low, fresh).astype(np.float32)
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()


def test_the_output_error_drops():
    m = conv_chain()
    batches = image_batches(m, n=16)
    # minmax: ranges that clip nothing, so that all of the activations' error is rounding
    plain = onnxq.quantize(m, batches, method="minmax", **COMMON)
    shifted = onnxq.quantize(m, batches, method="minmax", shift_activations=True, **COMMON)
    fresh = batches[:4]  # within the minmax ranges: no value is clipped
    ref = run(m, fresh)
    err_plain = float(((run(plain.model, fresh) - ref) ** 2).mean())
    err_shifted = float(((run(shifted.model, fresh) - ref) ** 2).mean())
    assert err_shifted < 0.7 * err_plain
    # what rounding the two Relu outputs adds to the weights' rounding (which the shift
    # leaves alone): a quarter, the square of half the step
    weights_only = run(without_activation_qdq(plain.model), fresh)
    relus = [without_activation_qdq(q.model, {"x"}) for q in (plain, shifted)]
    act_plain, act_shifted = (float(((run(q, fresh) - weights_only) ** 2).mean()) for q in relus)
    assert 0.15 * act_plain < act_shifted < 0.35 * act_plain


def test_a_padded_reader_pads_with_the_shift_before_the_quantizelinear():
    m = conv_act_conv("Clip", 16)
    out = onnxq.quantize(m, image_batches(m), shift_activations=True, **COMMON).model
    (pad,) = ops(out, "Pad")
    (sub,) = ops(out, "Sub")
    producer = {o: n for n in out.graph.node for o in n.output}
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert producer[pad.input[0]] is sub
    assert consts[pad.input[2]] == -consts[sub.input[1]]
    assert consts[pad.input[1]].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    (q,) = [n for n in ops(out, "QuantizeLinear") if n.input[0] == pad.output[0]]
    # the fill lands on the grid's lowest integer: the border sees exactly the old zeros
    assert consts[pad.input[2]] / consts[q.input[1]] == pytest.approx(-127, abs=1e-4)
    conv2 = next(n for n in out.graph.node if n.name == "conv2")
    pads = next(a for a in conv2.attribute if a.name == "pads")
    assert list(pads.ints) == [0, 0, 0, 0]


def test_the_output_is_byte_identical_run_to_run_and_the_input_is_untouched():
    m = conv_chain()
    before = m.SerializeToString()
    runs = [
        onnxq.quantize(m, image_batches(m), shift_activations=True, **COMMON).model
        for _ in range(2)
    ]
    assert runs[0].SerializeToString() == runs[1].SerializeToString()
    assert m.SerializeToString() == before


def test_the_cli_flag_shifts_and_the_report_says_so(tmp_path):
    m = conv_chain()
    src, out, report = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "r.json"
    onnx.save(m, src)
    data = tmp_path / "calib"
    data.mkdir()
    for i, b in enumerate(image_batches(m, n=4)):
        np.savez(data / f"{i:04d}.npz", **b)
    args = [str(src), "-o", str(out), "--calib", str(data), "--backend", "tensorrt", "-q"]
    assert main(["quantize", *args, "--shift-activations", "--report", str(report)]) == 0
    notes = json.loads(report.read_text())["notes"]
    assert any(n.startswith("shift_activations: 2 non-negative activations") for n in notes)
    assert ops(onnx.load(out), "Sub")
