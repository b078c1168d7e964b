"""Weight-only quantization end to end: formats per backend, defaults, bad input."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.errors import CalibrationDataError, ConfigError, UnsupportedModelError
from onnxq.ir import external
from onnxq.numerics.accuracy_target import AccuracyTarget
from tests import graphs
from tests.weightonly import models


def _cosine(a, b):
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def _logits(m, ids):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), opts).run(None, ids)[0]


def test_onnxruntime_rtn_without_data_writes_matmul_nbits_and_keeps_the_head_at_8_bits():
    m = models.decoder()
    q = onnxq.quantize(m, weight_only="int4", backend="onnxruntime", block_size=32, progress=False)
    ops = [n.op_type for n in q.model.graph.node]
    assert ops.count("MatMulNBits") == 4 and "GatherBlockQuantized" in ops and "MatMul" not in ops
    bits = {
        n.name: helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
        for n in q.model.graph.node
        if n.op_type in ("MatMulNBits", "GatherBlockQuantized")
    }
    assert sorted(bits.values()) == [4, 4, 4, 8, 8]
    layers = {r.node: r for r in q.report.layers}
    assert (
        layers["lm_head_proj"].format == "int8 sym block 32"
        and "head" in layers["lm_head_proj"].why
    )
    assert layers["embedding"].format == "int8 sym block 32"
    assert all(r.algorithm == "rtn" and r.error is None for r in q.report.layers)
    assert check(q.model, PROFILES["onnxruntime"]) == []
    ids = models.token_batches(1, seed=9)[0]
    assert _cosine(_logits(m, ids), _logits(q.model, ids)) > 0.97


def test_tensorrt_writes_blocked_int4_dequantize_linear_that_check_accepts():
    m = models.decoder(hidden=128, ffn=256)
    q = onnxq.quantize(m, models.token_batches(), weight_only="int4", progress=False)
    dqs = [n for n in q.model.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dqs) == 4 and q.model.graph.node[0].op_type != "GatherBlockQuantized"
    blocked = [n for n in dqs if any(a.name == "block_size" for a in n.attribute)]
    assert len(blocked) == 3  # the head is int8 per channel
    assert onnx.defs.onnx_opset_version() >= 21 and q.model.opset_import[0].version >= 21
    assert check(q.model, PROFILES["tensorrt"]) == []
    assert {r.algorithm.split(" ")[0] for r in q.report.layers} == {"awq+gptq"}
    assert all(r.error is not None and r.error < 0.05 for r in q.report.layers)
    assert q.report.fidelity and q.report.fidelity[0].cosine > 0.97


def test_the_same_inputs_give_the_same_bytes_and_the_input_model_is_untouched():
    m = models.decoder()
    before = m.SerializeToString()
    runs = [
        onnxq.quantize(
            m,
            models.token_batches(),
            weight_only="int4",
            backend="onnxruntime",
            block_size=32,
            weight_algorithm="awq+gptq",
            progress=False,
        )
        for _ in range(2)
    ]
    assert runs[0].model.SerializeToString() == runs[1].model.SerializeToString()
    assert m.SerializeToString() == before


def test_excludes_and_overrides_choose_per_layer():
    m = models.decoder()
    q = onnxq.quantize(
        m,
        weight_only="int4",
        backend="onnxruntime",
        block_size=32,
        exclude=["down_proj"],
        overrides=[{"node": "up_proj", "bits": 8}, {"node": "gate_proj", "block_size": 64}],
        progress=False,
    )
    layers = {r.node: r for r in q.report.layers}
    assert "down_proj" not in layers
    assert ("down_proj", "MatMul", "excluded by --exclude down_proj") in q.report.skipped
    assert layers["up_proj"].format == "int8 sym block 32"
    assert layers["gate_proj"].format == "int4 sym block 64"


def test_an_int8_weight_only_model_is_per_channel():
    m = models.decoder()
    for backend in ("onnxruntime", "tensorrt"):
        q = onnxq.quantize(m, weight_only="int8", backend=backend, progress=False)
        assert {r.format for r in q.report.layers if r.op_type == "MatMul"} == {
            "int8 sym per-channel"
        }
        assert check(q.model, PROFILES[backend]) == []


def test_a_model_without_weights_is_refused():
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="scores")
    m = graphs.model(
        [node],
        [graphs.tensor("a", [2, 4]), graphs.tensor("b", [4, 3])],
        [graphs.tensor("y", [2, 3])],
        opset=21,
    )
    with pytest.raises(UnsupportedModelError, match="no MatMul or Gemm with a constant"):
        onnxq.quantize(m, weight_only="int4", progress=False)


def test_gptq_without_data_says_what_to_give():
    with pytest.raises(CalibrationDataError, match=r"--algorithm gptq .*\(--calib"):
        onnxq.quantize(
            models.decoder(), weight_only="int4", weight_algorithm="gptq", progress=False
        )


@pytest.mark.parametrize(
    ("backend", "block"), [("onnxruntime", 48), ("onnxruntime", 8), ("tensorrt", 32)]
)
def test_a_block_size_the_backend_cannot_run_is_refused(backend, block):
    with pytest.raises(ConfigError, match=f"block_size {block}"):
        onnxq.quantize(
            models.decoder(), weight_only="int4", backend=backend, block_size=block, progress=False
        )


def test_a_block_size_that_does_not_divide_the_input_is_noted():
    m = models.decoder(hidden=96, ffn=160)  # 96 and 160 are no multiples of 64
    q = onnxq.quantize(m, weight_only="int4", backend="onnxruntime", block_size=64, progress=False)
    assert any("last block is shorter" in n for n in q.report.notes)
    ids = models.token_batches(1, seed=3)[0]
    assert _cosine(_logits(m, ids), _logits(q.model, ids)) > 0.95


def test_a_weight_shared_by_two_layers_is_quantized_once():
    r = graphs.rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="fc_a"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "w"], ["y"], name="fc_b"),
    ]
    m = graphs.model(
        nodes,
        [graphs.tensor("x", ["rows", 64])],
        [graphs.tensor("y", ["rows", 64])],
        [graphs.init("w", graphs.weight(r, 64, 64))],
        opset=21,
    )
    batches = [{"x": r.standard_normal((8, 64)).astype(np.float32)} for _ in range(2)]
    q = onnxq.quantize(
        m, batches, weight_only="int4", backend="onnxruntime", block_size=32, progress=False
    )
    assert any("read by 2 layers" in n for n in q.report.notes)
    assert sum(t.name.endswith("_nbits") for t in q.model.graph.initializer) == 1
    assert {r.algorithm for r in q.report.layers} == {"rtn"}


def test_an_already_weight_only_model_is_refused():
    q = onnxq.quantize(models.decoder(), weight_only="int4", backend="onnxruntime", progress=False)
    with pytest.raises(UnsupportedModelError, match="already"):
        onnxq.quantize(q.model, weight_only="int4", backend="onnxruntime", progress=False)


def test_a_large_model_is_read_weight_by_weight_and_saved_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(external, "LAZY_BYTES", 4096)
    m = models.decoder()
    path = tmp_path / "m.onnx"
    onnx.save(
        models.decoder(), str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    q = onnxq.quantize(
        path,
        models.token_batches(),
        weight_only="int4",
        backend="onnxruntime",
        block_size=32,
        progress=False,
    )
    out = tmp_path / "q.onnx"
    q.save(out)
    ids = models.token_batches(1, seed=2)[0]
    got = ort.InferenceSession(str(out)).run(None, ids)[0]
    assert _cosine(_logits(m, ids), got) > 0.97


def test_a_layer_int4_loses_too_much_in_keeps_8_bits(monkeypatch):
    from onnxq.weightonly import engine

    monkeypatch.setattr(engine, "PROMOTE_ERROR", 1e-9)  # every int4 layer passes it
    q = onnxq.quantize(
        models.decoder(),
        models.token_batches(),
        weight_only="int4",
        backend="onnxruntime",
        block_size=32,
        progress=False,
    )
    promoted = [r for r in q.report.layers if "int4 output error" in r.why]
    assert {r.node for r in promoted} == {"gate_proj", "up_proj", "down_proj"}
    assert all(r.format == "int8 sym block 32" for r in promoted)
    assert check(q.model, PROFILES["onnxruntime"]) == []


def test_on_tensorrt_a_layer_kept_at_8_bits_is_per_channel(monkeypatch):
    from onnxq.weightonly import engine

    monkeypatch.setattr(engine, "PROMOTE_ERROR", 1e-9)
    q = onnxq.quantize(
        models.decoder(hidden=128, ffn=256),
        models.token_batches(),
        weight_only="int4",
        progress=False,
    )
    promoted = [r for r in q.report.layers if "int4 output error" in r.why]
    assert promoted and {r.format for r in promoted} == {"int8 sym per-channel"}
    assert check(q.model, PROFILES["tensorrt"]) == []


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"target": "cosine=0.99"}, "target_accuracy"),
        (
            {"target": AccuracyTarget("cosine", 0.99, heldout=models.token_batches(1))},
            "target_accuracy",
        ),
        ({"save_calibration": "stats.json"}, "save_calibration"),
        ({"load_calibration": "stats.json"}, "load_calibration"),
        ({"cle": True}, "cle"),
        ({"adaround": True}, "adaround"),
        ({"calibration_mode": "prefix"}, "calibration_mode"),
        ({"smoothquant": 0.5}, "smoothquant"),
        ({"range_search": True}, "range_search"),
        ({"device": "cuda"}, "device"),
    ],
)
def test_a_static_option_is_refused_not_dropped(given, named):
    with pytest.raises(ConfigError, match=rf"^{named}: weight-only quantization .*drop"):
        onnxq.quantize(models.decoder(), weight_only="int4", progress=False, **given)


def test_an_executor_is_refused_not_dropped():
    from onnxq.scale.executor import InProcess

    with pytest.raises(ConfigError, match=r"^executor: weight-only quantization"):
        onnxq.quantize(models.decoder(), weight_only="int4", executor=InProcess())
