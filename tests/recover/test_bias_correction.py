"""Empirical bias correction: the removed shift is E[(W_q - W) x], only where it stands out of
the noise, on the layers that own a float bias; the rest of the pipeline is unchanged."""

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
from onnxq.numerics.qparams import quantize_weight, weight_qparams
from onnxq.recover.bias_correction import _significant
from tests import graphs


def offset_batches(
    model: onnx.ModelProto, n: int = 6, seed: int = 0, sizes: tuple[int, ...] | None = None
) -> list[dict[str, np.ndarray]]:
    """Inputs with mean 1, so that a weight error ``e`` shifts the output by about sum(e)."""
    r = np.random.default_rng(seed)
    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    out = []
    for i in range(n):
        if sizes is not None:
            shape[0] = sizes[i % len(sizes)]
        out.append({vi.name: (1.0 + 0.5 * r.standard_normal(shape)).astype(np.float32)})
    return out


def dequantized(w: np.ndarray, axis: int, method: str = "mse") -> np.ndarray:
    qp = weight_qparams(w, axis, 127, method)
    shape = [-1 if d == axis else 1 for d in range(w.ndim)]
    return quantize_weight(w, qp, 127).astype(np.float32) * qp.scale.reshape(shape)


def run(model: onnx.ModelProto, batch: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session.run(None, batch)[0]


def error_model(
    model: onnx.ModelProto, weight: str, error: np.ndarray, drop: tuple[str, ...] = ()
) -> onnx.ModelProto:
    """``model`` with ``weight`` replaced by ``error``, biases in ``drop`` zeroed and no ReLU:
    its output is exactly the layer's output error."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name == weight:
            t.CopyFrom(onnx.numpy_helper.from_array(error.astype(np.float32), weight))
        if t.name in drop:
            value = onnx.numpy_helper.to_array(t)
            t.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(value), t.name))
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    relu.op_type = "Identity"
    return m


def bias_of(model: onnx.ModelProto, name: str) -> np.ndarray:
    value = ir.Graph(model).const_value(name)
    assert value is not None, name
    return value


def oracle_shift(model, weight, axis, batches, channel_axis, drop=()) -> np.ndarray:
    """Mean over every value of the data of (W_q - W) x, per output channel."""
    w = bias_of(model, weight)
    err = error_model(model, weight, dequantized(w, axis) - w, drop)
    outs = [run(err, b) for b in batches]
    moved = [np.moveaxis(o, channel_axis, -1).reshape(-1, o.shape[channel_axis]) for o in outs]
    return np.concatenate(moved).astype(np.float64).mean(axis=0)


# --------------------------------------------------------------------------- the shift
def test_conv_bias_loses_exactly_the_measured_weight_error():
    model = graphs.conv_relu(seed=3)
    batches = offset_batches(model)
    # high_precision fp32: the removed shift is compared to float32 arithmetic; FP16
    # would round the stored bias (FP16: test_the_fp16_bias_is_the_corrected_bias_rounded)
    q = onnxq.quantize(model, batches, bias_correction=True, progress=False, high_precision="fp32")
    expected = oracle_shift(model, "conv.weight", 0, batches, 1, drop=("conv.bias",))
    removed = bias_of(model, "conv.bias") - bias_of(q.model, "conv.bias")
    (entry,) = q.report.bias_corrections
    assert entry.node == "conv" and entry.channels == 16 and entry.corrected >= 12
    corrected = removed != 0
    assert corrected.sum() == entry.corrected
    np.testing.assert_allclose(removed[corrected], expected[corrected], rtol=1e-3, atol=1e-6)
    assert np.abs(expected).max() > 1e-3  # the test data does shift the output


def test_gemm_correction_is_divided_by_beta():
    r = graphs.rng(1)
    nodes = [
        helper.make_node(
            "Gemm", ["x", "gemm.weight", "gemm.bias"], ["gemm_out"], name="gemm", transB=1, beta=0.5
        ),
        helper.make_node("Relu", ["gemm_out"], ["y"], name="relu"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", [8, 32])],
        [graphs.tensor("y", [8, 16])],
        [
            graphs.init("gemm.weight", graphs.weight(r, 16, 32)),
            graphs.init("gemm.bias", graphs.weight(r, 16)),
        ],
    )
    batches = offset_batches(model)
    # high_precision fp32: the removed shift is compared to float32 arithmetic; FP16
    # would round the stored bias (FP16: test_the_fp16_bias_is_the_corrected_bias_rounded)
    q = onnxq.quantize(model, batches, bias_correction=True, progress=False, high_precision="fp32")
    expected = oracle_shift(model, "gemm.weight", 0, batches, 1, drop=("gemm.bias",)) / 0.5
    removed = bias_of(model, "gemm.bias") - bias_of(q.model, "gemm.bias")
    corrected = removed != 0
    assert corrected.sum() >= 12
    np.testing.assert_allclose(removed[corrected], expected[corrected], rtol=1e-3, atol=1e-6)


def matmul_add(batch: int | str = 1) -> onnx.ModelProto:
    """x[B, 4, 32] @ W[32, 16] + b -> Relu (the bias as a separate Add, as exporters write)."""
    r = graphs.rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "fc.weight"], ["mm"], name="fc"),
        helper.make_node("Add", ["fc.bias", "mm"], ["fc_out"], name="fc_add"),
        helper.make_node("Relu", ["fc_out"], ["y"], name="relu"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [batch, 4, 32])],
        [graphs.tensor("y", [batch, 4, 16])],
        [
            graphs.init("fc.weight", graphs.weight(r, 32, 16)),
            graphs.init("fc.bias", graphs.weight(r, 16)),
        ],
    )


def test_matmul_correction_goes_into_the_following_add_weighted_by_batch_size():
    model = matmul_add("N")
    batches = offset_batches(model, n=6, sizes=(1, 3))  # the mean is over values, not batches
    # high_precision fp32: the removed shift is compared to float32 arithmetic; FP16
    # would round the stored bias (FP16: test_the_fp16_bias_is_the_corrected_bias_rounded)
    q = onnxq.quantize(model, batches, bias_correction=True, progress=False, high_precision="fp32")
    expected = oracle_shift(model, "fc.weight", 1, batches, 2, drop=("fc.bias",))
    removed = bias_of(model, "fc.bias") - bias_of(q.model, "fc.bias")
    corrected = removed != 0
    assert corrected.sum() >= 12
    np.testing.assert_allclose(removed[corrected], expected[corrected], rtol=1e-3, atol=1e-6)
    assert [c.node for c in q.report.bias_corrections] == ["fc"]


def test_the_fp16_bias_is_the_corrected_bias_rounded():
    """tensorrt's default output stores the bias a layer reads in FP16: the corrected FP32
    bias, rounded once (the correction is measured before the typing)."""
    model = graphs.conv_relu(seed=3)
    batches = offset_batches(model)
    high = onnxq.quantize(
        model, batches, bias_correction=True, progress=False, high_precision="fp32"
    )
    low = onnxq.quantize(model, batches, bias_correction=True, progress=False)
    assert low.report.bias_corrections == high.report.bias_corrections
    conv = ir.Graph(low.model).node_by_name("conv")
    stored = bias_of(low.model, conv.input[2])
    assert stored.dtype == np.float16
    np.testing.assert_array_equal(stored, bias_of(high.model, "conv.bias").astype(np.float16))


# --------------------------------------------------------------------------- where it applies
def test_layers_without_a_float_bias_are_left_alone():
    no_bias = graphs.conv_relu()
    del no_bias.graph.node[0].input[2]
    del no_bias.graph.initializer[1]
    q = onnxq.quantize(no_bias, offset_batches(no_bias), bias_correction=True, progress=False)
    assert q.report.bias_corrections == []


def test_a_bias_two_layers_share_is_corrected_per_layer():
    # loading gives each layer its own copy, so correcting one never shifts the other
    shared = graphs.conv_relu()
    conv2 = helper.make_node(
        "Conv", ["y", "conv.weight", "conv.bias"], ["y2"], name="conv2", pads=[1, 1, 1, 1]
    )
    shared.graph.node.append(conv2)
    shared.graph.output[0].name = "y2"
    q = onnxq.quantize(shared, offset_batches(shared), bias_correction=True, progress=False)
    corrected = q.report.bias_corrections
    assert corrected and len({c.bias for c in corrected}) == len(corrected)
    readers = [n for n in q.model.graph.node if n.op_type == "Conv"]
    assert len({n.input[2] for n in readers}) == len(readers)


def test_off_by_default_and_on_when_asked_for_either_backend():
    model = graphs.with_tail(graphs.conv_relu(seed=3))  # onnxruntime quantizes the conv
    batches = offset_batches(model)
    for backend in ("tensorrt", "onnxruntime"):
        off = onnxq.quantize(model, batches, backend=backend, progress=False)
        on = onnxq.quantize(model, batches, backend=backend, bias_correction=True, progress=False)
        assert off.report.bias_corrections == []
        assert [c.node for c in on.report.bias_corrections] == ["conv"]
        assert off.report.config["bias_correction"] is False


def test_int32_bias_of_onnxruntime_is_derived_from_the_corrected_bias():
    model = graphs.with_tail(graphs.conv_relu(seed=3))
    batches = offset_batches(model)
    on = onnxq.quantize(model, batches, backend="onnxruntime", bias_correction=True, progress=False)
    off = onnxq.quantize(model, batches, backend="onnxruntime", progress=False)

    def int32_bias(m: onnx.ModelProto) -> np.ndarray:
        g = ir.Graph(m)
        dq = g.producer[g.node_by_name("conv").input[2]]
        return g.const_value(dq.input[0]).astype(np.int64) * g.const_value(dq.input[1])

    assert not np.allclose(int32_bias(on.model), int32_bias(off.model))
    removed = int32_bias(off.model) - int32_bias(on.model)
    (entry,) = on.report.bias_corrections
    assert np.abs(removed).max() == pytest.approx(entry.max_shift, rel=0.05, abs=1e-4)


def test_one_shot_source_skips_with_a_warning():
    model = graphs.conv_relu(seed=3)
    q = onnxq.quantize(model, iter(offset_batches(model)), bias_correction=True, progress=False)
    assert q.report.bias_corrections == []
    assert any("bias correction skipped" in w for w in q.report.warnings)


# --------------------------------------------------------------------------- contracts
def test_corrected_model_passes_tensorrt_check_and_is_deterministic():
    model = graphs.residual_add()
    batches = offset_batches(model)
    first = onnxq.quantize(model, batches, bias_correction=True, progress=False)
    second = onnxq.quantize(model, batches, bias_correction=True, progress=False)
    assert first.report.bias_corrections
    assert check(first.model, PROFILES["tensorrt"]) == []
    assert ir.serialize(first.model) == ir.serialize(second.model)


def test_report_lists_the_corrections():
    model = graphs.conv_relu(seed=3)
    q = onnxq.quantize(model, offset_batches(model), bias_correction=True, progress=False)
    (entry,) = q.report.to_dict()["bias_corrections"]
    assert entry["node"] == "conv" and entry["bias"] == "conv.bias"
    assert 0 < entry["mean_abs_shift"] <= entry["max_shift"] < entry["bias_max_abs"]
    assert "bias correction: " in q.report.summary()
    assert "Bias corrections" in q.report.to_html()


def test_noise_filter_keeps_steady_shifts_and_drops_noise():
    steady = np.array([0.5, 0.5, 0.5, 0.5])
    noise = np.array([1.0, -1.0, 1.0, -1.0])
    per_batch = np.stack([steady, noise, steady * 0], axis=1)  # batches x channels
    shift = per_batch.mean(axis=0)
    keep = _significant(shift, per_batch.sum(axis=0), (per_batch**2).sum(axis=0), 4)
    assert keep.tolist() == [True, False, False]
    assert not _significant(shift, per_batch[:1].sum(0), (per_batch[:1] ** 2).sum(0), 1).any()
