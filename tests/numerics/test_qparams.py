"""Quantization parameters: the QuantizeLinear oracle, qparams invariants, weights and the
other element types (hypothesis invariants)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from onnxq.numerics.observers import METHODS
from onnxq.numerics.qparams import (
    activation_qparams,
    dequantize_weight,
    one_scale_sqnr_db,
    quantize_weight,
    range_to_qparams,
    weight_qparams,
)
from onnxq.numerics.tensor_stats import TensorStats

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)
QRANGE = {"int8": (-128, 127), "uint8": (0, 255)}

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
samples = hnp.arrays(np.float32, st.integers(1, 200), elements=finite)


# ------------------------------------------------------------------ the QuantizeLinear oracle
def quantize(x: np.ndarray, scale: np.float32, zero_point: np.ndarray, dtype: str) -> np.ndarray:
    """QuantizeLinear: round half to even, add the zero point, saturate."""
    qmin, qmax = QRANGE[dtype]
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale)) + int(zero_point)
    return np.clip(q, qmin, qmax).astype(dtype)


def dequantize(q: np.ndarray, scale: np.float32, zero_point: np.ndarray) -> np.ndarray:
    """DequantizeLinear."""
    return ((q.astype(np.int32) - int(zero_point)) * np.float32(scale)).astype(np.float32)


def test_numpy_oracle_matches_onnxruntime_quantize_linear():
    x = np.array([-3.0, -1.5, -0.5, 0.5, 1.5, 2.5, 0.25, 100.0, -100.0], dtype=np.float32)
    for dtype, zp in (("int8", np.int8(3)), ("uint8", np.uint8(128))):
        elem = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
        graph = helper.make_graph(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])],
            "q",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9])],
            [helper.make_tensor_value_info("q", elem, [9])],
            [
                helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
                helper.make_tensor("z", elem, [], [int(zp)]),
            ],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        (got,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(got, quantize(x, np.float32(0.5), zp, dtype))


# ------------------------------------------------------------------ qparams invariants
@st.composite
def ranges(draw):
    a, b = draw(finite), draw(finite)
    return min(a, b), max(a, b)


@SETTINGS
@given(ranges(), st.booleans(), st.sampled_from(["int8", "uint8"]))
def test_scale_is_positive_and_finite(lohi, symmetric, dtype):
    qp = range_to_qparams(*lohi, dtype, symmetric)
    assert qp.scale.dtype == np.float32
    assert np.isfinite(qp.scale) and qp.scale > 0


@SETTINGS
@given(ranges())
def test_symmetric_int8_has_zero_point_zero(lohi):
    qp = range_to_qparams(*lohi, "int8", symmetric=True)
    assert qp.zero_point.dtype == np.int8
    assert int(qp.zero_point) == 0
    assert qp.low == -qp.high


@SETTINGS
@given(
    ranges(),
    st.booleans(),
    st.sampled_from(["int8", "uint8"]),
    st.floats(0.0, 1.0),
    st.sampled_from(list(METHODS)),
)
def test_round_trip_error_is_at_most_half_a_step_inside_the_range(
    lohi, symmetric, dtype, t, method
):
    qp = range_to_qparams(*lohi, dtype, symmetric, method)
    lo, hi = qp.low, qp.high
    assert lo <= min(lohi[0], 0.0) + 1e-6 and hi >= max(lohi[1], 0.0) - 1e-6
    x = np.float32(lo + t * (hi - lo))
    x = np.clip(x, np.float32(lo), np.float32(hi))
    q = quantize(x, qp.scale, qp.zero_point, dtype)
    err = abs(float(x) - float(dequantize(q, qp.scale, qp.zero_point)))
    # float32 arithmetic of QuantizeLinear itself: a few ulps on top of the half step
    slack = 1e-5 * float(qp.scale) + 4 * float(np.spacing(np.float32(abs(x) + qp.scale)))
    assert err <= float(qp.scale) / 2 + slack


@SETTINGS
@given(st.booleans(), st.sampled_from(list(METHODS)))
def test_all_zero_tensor_gives_positive_scale_and_a_note(symmetric, method):
    stats = TensorStats("zeros")
    stats.update(np.zeros((4, 8), np.float32))
    qp = activation_qparams(stats, method, "int8", symmetric)
    assert qp.scale > 0 and np.isfinite(qp.scale)
    assert "constant zero" in qp.note


# ------------------------------------------------------------------ weights
weight_shapes = st.sampled_from([(16, 8, 3, 3), (8, 4, 1, 1), (32, 16), (16, 32), (5,)])


@SETTINGS
@given(weight_shapes, st.integers(0, 3), st.integers(0, 2**32 - 1), st.floats(1e-3, 1e2))
def test_weight_qparams_per_channel_shape_and_int8_range(shape, axis, seed, gain):
    axis = axis % len(shape)
    w = (np.random.default_rng(seed).standard_normal(shape) * gain).astype(np.float32)
    qp = weight_qparams(w, axis)
    assert qp.axis == axis
    assert qp.scale.shape == (shape[axis],) and qp.scale.dtype == np.float32
    assert qp.zero_point.shape == (shape[axis],) and qp.zero_point.dtype == np.int8
    assert np.all(qp.zero_point == 0) and np.all(qp.scale > 0)
    q = quantize_weight(w, qp)
    assert q.dtype == np.int8
    assert q.min() >= -127 and q.max() <= 127
    bshape = [1] * w.ndim
    bshape[axis] = -1
    scale = qp.scale.reshape(bshape)
    assert np.all(np.abs(w - q.astype(np.float32) * scale) <= scale / 2 * (1 + 1e-5))
    # the largest magnitude of every channel maps to +-127
    assert np.all(np.abs(q).max(axis=tuple(i for i in range(w.ndim) if i != axis)) == 127)


def test_weight_qparams_per_tensor_and_zero_channels():
    w = np.zeros((4, 3), np.float32)
    w[1] = [0.5, -1.0, 0.25]
    per_channel = weight_qparams(w, 0)
    assert np.all(per_channel.scale > 0)  # all-zero channels get a harmless positive scale
    assert np.isclose(per_channel.scale[1], 1.0 / 127)
    per_tensor = weight_qparams(w, None)
    assert per_tensor.axis is None and per_tensor.scale.shape == ()
    assert quantize_weight(w, per_tensor)[1, 1] == -127


def test_quantize_weight_respects_a_smaller_qmax():
    w = np.array([[1.1, -1.1, 0.25, 2.0]], np.float32)
    qp = weight_qparams(w, 0, qmax=63)
    assert np.isclose(qp.scale[0], 2.0 / 63)
    q = quantize_weight(w, qp, qmax=63)
    assert q.tolist() == [[35, -35, 8, 63]]  # 34.65 and 7.875 round to nearest
    assert quantize_weight(w * 3, qp, qmax=63).max() == 63  # saturates at qmax


@pytest.mark.parametrize("shape", [(37, 11), (5, 300), (1, 9), (64, 1)])
def test_blocked_weight_mse_search_equals_the_whole_tensor_search(shape):
    from onnxq.numerics.qparams import _WEIGHT_CLIP_RATIOS, _mse_weight_range

    r = np.random.default_rng(3)
    rows = (r.standard_normal(shape) * r.uniform(0.01, 3, (shape[0], 1))).astype(np.float32)
    amax = np.abs(rows).max(axis=1)
    # the plain search over whole-tensor temporaries
    best, best_err = amax.copy(), np.full(len(rows), np.inf)
    for ratio in _WEIGHT_CLIP_RATIOS:
        cand = amax * ratio
        scale = (cand / np.float32(127))[:, None]
        err = ((np.clip(np.rint(rows / scale), -127, 127) * scale - rows) ** 2).sum(axis=1)
        best = np.where(err < best_err, cand, best)
        best_err = np.minimum(err, best_err)
    for block in (1, 7, 1 << 16):
        np.testing.assert_array_equal(_mse_weight_range(rows, amax, 127, block=block), best)


# --------------------------------------------------------------------- other element types
def _observed(values: np.ndarray) -> TensorStats:
    stats = TensorStats("t")
    stats.update(values)
    return stats


def test_fp8_activation_scale_is_amax_over_448_and_auto_means_amax():
    values = np.concatenate([np.random.default_rng(0).normal(0, 1, 10_000), [40.0]])
    qp = activation_qparams(_observed(values.astype(np.float32)), "auto", "float8e4m3fn", True)
    assert float(qp.scale) == pytest.approx(40.0 / 448, rel=1e-6)
    assert qp.zero_point.dtype.name == "float8_e4m3fn" and float(qp.zero_point) == 0.0
    assert qp.method == "minmax"  # int8's auto would clip the outlier; FP8 keeps it


def test_sixteen_bit_activation_uses_the_full_uint16_range():
    values = np.linspace(-1.0, 3.0, 1001, dtype=np.float32)
    qp = activation_qparams(_observed(values), "minmax", "uint16", False)
    assert float(qp.scale) == pytest.approx(4.0 / 65535, rel=1e-6)
    assert qp.zero_point.dtype == np.uint16 and int(qp.zero_point) == round(1.0 / (4.0 / 65535))
    narrowed = activation_qparams(_observed(values), "minmax", "uint16", False, bits=12)
    assert float(narrowed.scale) == pytest.approx(4.0 / 4095, rel=1e-6)


def test_sixteen_bit_auto_clips_less_than_eight_bit():
    values = np.random.default_rng(1).laplace(0, 1, 50_000).astype(np.float32)
    eight = activation_qparams(_observed(values), "auto", "uint8", False)
    sixteen = activation_qparams(_observed(values), "auto", "uint16", False)
    assert sixteen.high - sixteen.low >= eight.high - eight.low
    assert sixteen.high == pytest.approx(values.max(), rel=1e-3)  # 65535 levels: no clipping


def test_fp8_weight_is_per_channel_amax_and_keeps_three_mantissa_bits():
    w = np.random.default_rng(2).normal(0, 1, (8, 16)).astype(np.float32)
    w[3] *= 50
    qp = weight_qparams(w, 0, method="mse", dtype="float8e4m3fn")  # mse is ignored for FP8
    np.testing.assert_allclose(qp.scale, np.abs(w).max(axis=1) / 448, rtol=1e-6)
    q = quantize_weight(w, qp)
    assert q.dtype.name == "float8_e4m3fn"
    back = dequantize_weight(q, qp)
    # E4M3 keeps 3 mantissa bits: every value within 1/16 of itself (2^-4 relative)
    assert np.all(np.abs(back - w) <= np.abs(w) / 16 + 1e-12)


@pytest.mark.parametrize(("qmax", "loud"), [(127, 1.0), (63, 1.0), (127, 30.0)])
def test_one_scale_sqnr_follows_the_rounding_noise_it_models(qmax, loud):
    w = np.random.default_rng(0).normal(0, 0.1, (256, 128)).astype(np.float32)
    w[:, :4] *= loud  # a few loud columns: one scale rounds the rest coarsely
    qp = weight_qparams(w, None, qmax, "minmax")
    noise = dequantize_weight(quantize_weight(w, qp, qmax), qp) - w
    measured = 10 * np.log10(
        np.sum(w.astype(np.float64) ** 2) / np.sum(noise.astype(np.float64) ** 2)
    )
    assert abs(one_scale_sqnr_db(w, qmax) - measured) < 0.5
    assert one_scale_sqnr_db(np.zeros((4, 4), np.float32)) == float("inf")


def test_one_scale_sqnr_loses_six_db_a_bit():
    w = np.random.default_rng(1).normal(0, 1, (64, 64)).astype(np.float32)
    assert one_scale_sqnr_db(w, 127) - one_scale_sqnr_db(w, 63) == pytest.approx(6.1, abs=0.05)
