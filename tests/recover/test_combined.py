"""The recovery steps together: every combination passes the backend's check, and bias
correction measures the error of the integers AdaRound chose."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.numerics.qparams import weight_qparams
from onnxq.recover.bias_correction import correct_biases
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import placed


def conv_then_matmul(seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Reshape to tokens -> LayerNorm -> MatMul (+ bias) -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c2", "shape"], ["tokens"], name="to_tokens"),
        helper.make_node("Transpose", ["tokens"], ["seq"], name="seq", perm=[0, 2, 1]),
        helper.make_node("LayerNormalization", ["seq", "g", "b"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "w3"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "b3"], ["y"], name="fc_bias"),
    ]
    w1 = weight(r, 32, 16, 3, 3) * np.geomspace(0.1, 3, 32, dtype=np.float32)[:, None, None, None]
    inits = [
        init("w1", w1),
        init("b1", weight(r, 32)),
        init("w2", weight(r, 32, 32, 3, 3)),
        init("b2", weight(r, 32)),
        init("shape", np.array([1, 32, 64], dtype=np.int64)),
        init("g", (1 + 0.1 * r.standard_normal(32)).astype(np.float32)),
        init("b", weight(r, 32)),
        init("w3", weight(r, 32, 32)),
        init("b3", weight(r, 32)),
    ]
    return model(nodes, [tensor("x", [1, 16, 8, 8])], [tensor("y", [1, 64, 32])], inits)


def batches(n: int = 6) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(1)
    return [{"x": (1 + r.standard_normal((1, 16, 8, 8))).astype(np.float32)} for _ in range(n)]


COMBINATIONS = [
    {},
    {"cle": True},
    {"smoothquant": 0.8},
    {"calibration_mode": "prefix"},
    {"adaround": True},
    {"bias_correction": True},
    {"adaround": True, "bias_correction": True},
    {"cle": True, "calibration_mode": "prefix", "adaround": True},
    {
        "cle": True,
        "smoothquant": 0.8,
        "calibration_mode": "prefix",
        "adaround": True,
        "bias_correction": True,
    },
]


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
@pytest.mark.parametrize("options", COMBINATIONS, ids=lambda o: "+".join(o) or "none")
def test_every_combination_passes_check(backend, options):
    m = conv_then_matmul()
    chosen = {"smoothquant": 0.0, **options}  # SmoothQuant is on by default: off unless named
    result = onnxq.quantize(
        m, batches(), backend=backend, adaround_steps=50, progress=False,
        smoothquant_min_spread=1.0, **chosen,
    )  # fmt: skip
    assert check(result.model, PROFILES[backend]) == []
    steps = set(result.report.to_dict().get("recovery", {}))
    expected = {
        "cle": "cle",
        "smoothquant": "smoothquant",
        "calibration_mode": "calibration",
        "adaround": "adaround",
    }
    assert steps == {expected[k] for k in options if k in expected}
    assert result.report.fidelity[0].cosine > 0.95


def test_bias_correction_measures_the_chosen_integers():
    m = ir.infer_shapes(conv_then_matmul())
    cfg = QuantConfig(progress=False, bias_correction=True)
    profile = PROFILES["tensorrt"]
    graph = ir.Graph(m)
    annotations, _ = placed(m, profile, cfg, batches(), model_inputs(graph))
    w = graph.const_value("w2")
    qp = weight_qparams(w, 0, 127, cfg.weight_method)
    one_up = np.clip(np.rint(w / qp.scale[:, None, None, None]) + 1, -127, 127).astype(np.int8)
    plain = correct_biases(
        onnx.load_from_string(m.SerializeToString()), annotations, profile, cfg.weights, batches(),
        model_inputs(graph),
    )  # fmt: skip
    chosen = correct_biases(
        onnx.load_from_string(m.SerializeToString()), annotations, profile, cfg.weights, batches(),
        model_inputs(graph), None, {"w2": (qp, one_up)},
    )  # fmt: skip
    shift = {c.node: c.max_shift for c in chosen}
    before = {c.node: c.max_shift for c in plain}
    # every weight one step up: each output moves by about sum(scale * x) over its patch
    assert shift["conv2"] > 10 * before.get("conv2", 0.0)
    assert shift.get("conv1") == before.get("conv1")


def test_the_same_inputs_give_the_same_bytes():
    m = conv_then_matmul()
    options = dict(COMBINATIONS[-1], adaround_steps=50, smoothquant_min_spread=1.0, progress=False)
    first = onnxq.quantize(m, batches(), **options).model.SerializeToString()
    again = onnxq.quantize(m, batches(), **options).model.SerializeToString()
    assert first == again


def test_a_calibration_cache_skips_the_float_rewrites(tmp_path):
    m = conv_then_matmul()
    cache = tmp_path / "stats.json"
    options = dict(cle=True, smoothquant_min_spread=1.0, progress=False)
    saved = onnxq.quantize(m, batches(), save_calibration=cache, **options)
    loaded = onnxq.quantize(m, batches(), load_calibration=cache, **options)
    for result in (saved, loaded):
        report = result.report
        assert "recovery" not in report.to_dict()  # neither CLE nor SmoothQuant ran
        assert any(w.startswith("cle skipped: a calibration cache") for w in report.warnings)
        assert any(n.startswith("smoothquant skipped: a calibration cache") for n in report.notes)
    assert saved.model.SerializeToString() == loaded.model.SerializeToString()
