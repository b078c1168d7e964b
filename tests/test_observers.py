"""Observers: streaming statistics, range methods and qparams (hypothesis invariants)."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from onnxq import observers
from onnxq.errors import CalibrationDataError, ConfigError
from onnxq.observers import (
    BINS,
    METHODS,
    MethodOptions,
    TensorStats,
    activation_qparams,
    dequantize_weight,
    get_method,
    quantize_weight,
    range_to_qparams,
    weight_qparams,
)

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


# ------------------------------------------------------------------ statistics
NATIVE = observers._native  # the compiled histogram update, when it was built at install
needs_native = pytest.mark.skipif(
    NATIVE is None,
    reason="onnxq._histogram is not built (no C compiler at install, or "
    "ONNXQ_NO_NATIVE=1): only the numpy path can be tested",
)


@contextlib.contextmanager
def histogram_path(path: str):
    """Count histograms with the compiled update (``native``) or with numpy."""
    saved = observers._native
    observers._native = NATIVE if path == "native" else None
    try:
        yield
    finally:
        observers._native = saved


@pytest.fixture(params=["native", "numpy"])
def both_paths(request):
    """Run a test once per histogram path (native skipped where it is not built)."""
    if request.param == "native" and NATIVE is None:
        pytest.skip("onnxq._histogram is not built")
    with histogram_path(request.param):
        yield request.param


def observe(name: str, chunks) -> TensorStats:
    stats = TensorStats(name)
    for chunk in chunks:
        stats.update(np.asarray(chunk, np.float32))
    return stats


def assert_same_stats(a: TensorStats, b: TensorStats) -> None:
    assert a.count == b.count
    assert a.min == b.min and a.max == b.max
    assert a.range == b.range
    np.testing.assert_array_equal(a.counts, b.counts)


@SETTINGS
@given(samples, samples)
@example(np.array([1.0], np.float32), np.array([2.0], np.float32))
def test_merge_of_two_shards_equals_observing_all_data(x, y):
    left, right = observe("t", [x]), observe("t", [y])
    merged = left.merge(right)
    whole = observe("t", [np.concatenate([x, y])])
    assert_same_stats(merged, whole)
    assert merged.count == x.size + y.size
    assert merged.min == float(min(x.min(), y.min()))
    assert merged.max == float(max(x.max(), y.max()))


def test_merge_with_an_empty_shard_is_the_identity():
    x = np.linspace(-3, 5, 101, dtype=np.float32)
    stats = observe("t", [x])
    assert_same_stats(observe("t", [x]).merge(TensorStats("t")), stats)
    assert_same_stats(TensorStats("t").merge(observe("t", [x])), stats)


@pytest.mark.usefixtures("both_paths")
def test_bin_index_is_exact_when_the_range_grows():
    # 3.062495 * 16 = 48.99992 lies in bin 2048 + 48 of the [-128, 128] histogram; adding 2048
    # in float32 rounds it up to 2097 when both values arrive in one batch.
    small, big = np.float32(3.062495), np.float32(120.641754)
    one_batch = observe("t", [[small, big]])
    two_batches = observe("t", [[small], [big]])
    merged = observe("t", [[small]]).merge(observe("t", [[big]]))
    assert one_batch.range == 128.0
    assert np.nonzero(one_batch.counts)[0].tolist() == [2048 + 48, 2048 + 1930]
    assert_same_stats(one_batch, two_batches)
    assert_same_stats(one_batch, merged)


@pytest.mark.usefixtures("both_paths")
def test_a_value_equal_to_the_range_keeps_its_bin_when_the_range_grows():
    # 1.0 is exactly R for the first batch: it is clipped into the top bin of [-1, 1], which
    # merges into bin 3071 of [-2, 2]; seen together with 2.0 it lands in bin 3072.
    two_batches = observe("t", [[1.0], [2.0]])
    one_batch = observe("t", [[1.0, 2.0]])
    assert one_batch.range == two_batches.range == 4.0  # strictly above the largest |x|
    assert_same_stats(two_batches, one_batch)


@SETTINGS
@given(hnp.arrays(np.float32, (64, 3), elements=finite), st.floats(1e-3, 1e3))
def test_batching_does_not_change_histogram_or_qparams(data, gain):
    data = (data * np.float32(gain)).astype(np.float32)
    singles = observe("t", [data[i : i + 1] for i in range(64)])
    eights = observe("t", [data[i : i + 8] for i in range(0, 64, 8)])
    assert_same_stats(singles, eights)
    for method in METHODS:
        for symmetric in (True, False):
            a = activation_qparams(singles, method, "int8", symmetric)
            b = activation_qparams(eights, method, "int8", symmetric)
            assert a.scale == b.scale and a.zero_point == b.zero_point, method


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_batching_invariance_on_gaussian_data_with_outliers(seed):
    r = np.random.default_rng(seed)
    data = r.standard_normal((64, 16)).astype(np.float32)
    data[r.integers(0, 64), r.integers(0, 16)] = np.float32(r.uniform(20, 200))
    singles = observe("t", [data[i : i + 1] for i in range(64)])
    eights = observe("t", [data[i : i + 8] for i in range(0, 64, 8)])
    assert_same_stats(singles, eights)
    for method in METHODS:
        a = activation_qparams(singles, method, "int8", True)
        b = activation_qparams(eights, method, "int8", True)
        assert a.scale == b.scale, method


@pytest.mark.usefixtures("both_paths")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_raises_calibration_data_error(bad):
    stats = TensorStats("act")
    x = np.ones(10, np.float32)
    x[3] = bad
    with pytest.raises(CalibrationDataError, match=r"'act'.*NaN or Inf.* in batch 7"):
        stats.update(x, where=" in batch 7")
    assert stats.count == 0


# the values the two histogram paths must bin alike: both signs, exact zeros and -0, values
# that underflow when scaled, and magnitudes up to 1e6 (a scale below 1, double precision)
edgy = st.one_of(
    finite,
    st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 2.0**-140, -(2.0**-149), 1e6, -1e6, 2047.9, 4096.0]),
)


@needs_native
@SETTINGS
@given(
    st.lists(
        hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 300)), elements=edgy),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([1, 2, 3, 7, 64]),
    st.booleans(),
)
def test_native_and_numpy_histograms_are_identical(batches, stride, nonnegative):
    if nonnegative:
        batches = [np.abs(b) for b in batches]
    paths = {}
    for path in ("native", "numpy"):
        with histogram_path(path):
            stats = TensorStats("t", nonnegative=nonnegative)
            for b in batches:
                stats.update(b, stride=stride)
            paths[path] = stats
    assert_same_stats(paths["native"], paths["numpy"])


@needs_native
def test_native_count_checks_its_arguments_and_counts_nothing_on_error():
    counts = np.zeros(8, np.int64)
    x = np.array([[0.5, -0.5, 1.5]], np.float32)
    NATIVE.count(x, 1, 1, 2.0, 4, counts)  # bins floor(2v) + 4
    assert counts.tolist() == [0, 0, 0, 1, 0, 1, 0, 1]
    NATIVE.count(x, 1, 2, 2.0, 4, counts)  # every 2nd value: 0.5 and 1.5
    assert counts.tolist() == [0, 0, 0, 1, 0, 2, 0, 2]
    before = counts.copy()
    for bad in (np.float32(9.0), np.float32(np.nan)):
        with pytest.raises(ValueError, match="outside the histogram"):
            NATIVE.count(np.array([[0.5, bad]], np.float32), 1, 1, 2.0, 4, counts)
    np.testing.assert_array_equal(counts, before)
    with pytest.raises(TypeError, match="float32 values and int64 counts"):
        NATIVE.count(x.astype(np.float64), 1, 1, 2.0, 4, counts)
    with pytest.raises(TypeError, match="float32 values and int64 counts"):
        NATIVE.count(x, 1, 1, 2.0, 4, counts.astype(np.int32))
    with pytest.raises(ValueError, match="rows must divide"):
        NATIVE.count(x, 2, 1, 2.0, 4, counts)
    with pytest.raises(ValueError, match="must be positive"):
        NATIVE.count(x, 1, 0, 2.0, 4, counts)
    with pytest.raises(ValueError, match="not C-contiguous"):
        NATIVE.count(x, 1, 1, 2.0, 4, np.zeros(8, np.int64)[::-1])  # not contiguous


def test_the_native_update_is_built_where_ci_requires_it(monkeypatch):
    # CI sets ONNXQ_REQUIRE_NATIVE=1: there a missing build is a failure, not a quiet fallback
    if os.environ.get("ONNXQ_REQUIRE_NATIVE") == "1":
        assert NATIVE is not None, "onnxq._histogram was not built: is a C compiler installed?"
    monkeypatch.setenv("ONNXQ_NO_NATIVE", "1")
    assert observers._load_native() is None
    monkeypatch.setenv("ONNXQ_NO_NATIVE", "0")
    built = importlib.util.find_spec("onnxq._histogram") is not None
    assert (observers._load_native() is not None) == built


@pytest.mark.usefixtures("both_paths")
def test_update_ignores_empty_arrays_and_accepts_float64():
    stats = TensorStats("t")
    stats.update(np.zeros((0, 4), np.float32))
    assert stats.count == 0 and stats.range == 0.0
    stats.update(np.array([0.5, -2.0], np.float64))
    assert (stats.count, stats.min, stats.max, stats.range) == (2, -2.0, 0.5, 4.0)
    assert stats.counts.sum() == 2 and stats.counts.size == BINS


@pytest.mark.usefixtures("both_paths")
def test_range_is_the_smallest_power_of_two_strictly_above_the_largest_magnitude():
    stats = observe("t", [[0.3], [-5.0], [2.0]])
    assert stats.range == 8.0
    stats.update(np.array([8.0], np.float32))  # 8 would sit on the top edge of [-8, 8]
    assert stats.range == 16.0 and stats.counts.sum() == 4


def test_json_round_trip_keeps_statistics():
    stats = observe("t", [np.random.default_rng(1).standard_normal(500)])
    back = TensorStats.from_json("t", stats.to_json())
    assert_same_stats(back, stats)


def test_without_histogram_only_min_max_are_kept():
    stats = TensorStats("t", histogram=False)
    stats.update(np.array([1.0, -3.0], np.float32))
    assert (stats.min, stats.max, stats.count) == (-3.0, 1.0, 2)
    assert stats.counts.sum() == 0
    qp = activation_qparams(stats, "minmax", "int8", True)
    assert np.isclose(qp.scale, 3.0 / 127)


# ------------------------------------------------------------------ range methods
def test_get_method_bogus_raises_config_error_listing_valid_names():
    with pytest.raises(ConfigError, match="bogus") as info:
        get_method("bogus")
    for name in METHODS:
        assert name in str(info.value)


def test_every_registered_method_is_callable_by_name():
    assert {"minmax", "percentile", "entropy", "mse"} <= set(METHODS)
    for name in METHODS:
        assert get_method(name) is METHODS[name]


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.floats(20.0, 500.0))
def test_histogram_methods_clip_outliers_inside_the_minmax_range(seed, outlier):
    r = np.random.default_rng(seed)
    data = r.standard_normal(20_000).astype(np.float32)
    data[:3] = np.float32(outlier)
    data[3] = np.float32(-outlier / 2)
    stats = observe("t", [data])
    opts = MethodOptions(percentile=99.9)
    lo_mm, hi_mm = get_method("minmax")(stats, False, opts)
    amax_mm = max(abs(lo_mm), abs(hi_mm))
    for method in ("percentile", "entropy", "mse"):
        lo, hi = get_method(method)(stats, True, opts)
        assert 0 < hi <= amax_mm and lo == -hi, method
        lo, hi = get_method(method)(stats, False, opts)
        assert lo_mm <= lo < 0 < hi <= hi_mm, method
    # on this data the percentile clips well inside the outlier
    assert get_method("percentile")(stats, True, opts)[1] < outlier / 2


def test_percentile_100_keeps_the_whole_range():
    data = np.linspace(-1.0, 3.0, 1001, dtype=np.float32)
    stats = observe("t", [data])
    lo, hi = get_method("percentile")(stats, False, MethodOptions(percentile=100.0))
    assert lo == pytest.approx(-1.0) and hi == pytest.approx(3.0)


def test_robust_minmax_is_minmax_unless_a_few_outliers_set_the_range():
    rng = np.random.default_rng(0)
    bulk = rng.standard_normal(200_000).astype(np.float32)
    # a moderate tail (max |x| about 1.3x the 99.99th percentile): the whole range, as minmax
    tail = observe("t", [bulk])
    qp = activation_qparams(tail, "robust_minmax", "uint8", symmetric=False)
    assert qp.method == "robust_minmax:minmax"
    assert (qp.low, qp.high) == pytest.approx((tail.min, tail.max), rel=1e-6)
    # a few values 40x beyond the bulk (a conv output over [-174, 172]): the percentile range
    spiky = observe("t", [np.concatenate([bulk, np.float32([170.0, -160.0])])])
    qp = activation_qparams(spiky, "robust_minmax", "uint8", symmetric=False)
    assert qp.method == "robust_minmax:percentile"
    assert qp.high < 10 and qp.low > -10


def test_asymmetric_uint8_qparams_cover_the_range():
    qp = range_to_qparams(0.0, 6.0, "uint8", symmetric=False)
    assert qp.zero_point.dtype == np.uint8 and int(qp.zero_point) == 0
    assert np.isclose(qp.scale, 6.0 / 255)
    qp = range_to_qparams(-1.0, 1.0, "int8", symmetric=False)
    assert qp.zero_point.dtype == np.int8 and int(qp.zero_point) in (-1, 0)


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
    from onnxq.observers import _WEIGHT_CLIP_RATIOS, _mse_weight_range

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


@pytest.mark.usefixtures("both_paths")
def test_tiny_negative_values_keep_their_bin_when_the_range_is_large():
    # at R = 8192, -3e-45 * (4096 / 2R) underflows to -0 in float32 (bin above zero); alone,
    # at R = 2^-24, it lands below zero: the large-range product must not lose its sign
    shard_a, shard_b = observe("t", [[4096.0]]), observe("t", [[-3e-45]])
    whole = observe("t", [[4096.0, -3e-45]])
    assert_same_stats(shard_a.merge(shard_b), whole)
    assert whole.counts[BINS // 2 - 1] == 1


def test_entropy_is_not_pulled_down_by_the_exact_zeros_of_a_relu():
    # a ReLU of a Laplace: half exact zeros.  Left in the KL, the zero spike pulled the
    # threshold to 2.0 (mobilenet_v2 scored 0.17 with --method entropy); 99.99% is at 8.7
    r = np.random.default_rng(0)
    x = np.maximum(r.laplace(0.0, 1.0, 1_000_000), 0.0).astype(np.float32)
    stats = TensorStats("relu")
    stats.update(x.reshape(1, -1))
    lo, hi = get_method("entropy")(stats, True, MethodOptions())
    assert 6.0 < hi < float(x.max()) and lo == -hi


def test_channel_peaks_are_exact_merge_across_shards_and_survive_json():
    r = np.random.default_rng(5)
    x = (r.standard_normal((6, 4, 5, 5)) * np.array([1, 0.01, 3, 0.5])[None, :, None, None]).astype(
        np.float32
    )
    whole = TensorStats("t", channels=True)
    whole.update(x)
    plain = TensorStats("t")
    plain.update(x)
    want = np.abs(x).max(axis=(0, 2, 3))
    np.testing.assert_array_equal(whole.channel_amax, want)
    # the per-channel path gives the same min/max/histogram as the plain one
    assert (whole.min, whole.max, whole.samples) == (plain.min, plain.max, plain.samples)
    assert whole.sample_min_sum == plain.sample_min_sum
    np.testing.assert_array_equal(whole.counts, plain.counts)
    left, right = TensorStats("t", channels=True), TensorStats("t", channels=True)
    left.update(x[:2])
    right.update(x[2:])
    np.testing.assert_array_equal(left.merge(right).channel_amax, want)
    again = TensorStats.from_json("t", whole.to_json())
    np.testing.assert_array_equal(again.channel_amax, want)
    assert whole.weak_channels(1 / 16) == (1, 4)  # only the 0.01 channel: 0.01 < 3 / 16
    assert TensorStats("t").weak_channels() is None
    # a shard without channel peaks leaves no per-channel view of the whole
    assert left.merge(plain).channel_amax is None


@pytest.mark.usefixtures("both_paths")
@pytest.mark.parametrize("channels", [False, True])
@pytest.mark.parametrize("stride", [1, 3])
def test_a_nonnegative_tensor_reads_only_maxima_and_bins_like_a_signed_one(channels, stride):
    # Relu-like data (a third exactly 0); the one-pass binning of values >= 0 gives the bins
    # of the floor path, at small and large ranges (float32 scale above and below 1)
    r = np.random.default_rng(7)
    for gain in (1.0, 1e4):
        x = np.maximum(r.standard_normal((4, 8, 10, 10)) * gain, 0).astype(np.float32)
        x[0, 0, 0, :3] = [1e-30, 2.0**-140, -0.0]  # underflow in the product, and a -0
        fast = TensorStats("t", channels=channels, nonnegative=True)
        slow = TensorStats("t", channels=channels)
        for part in (x[:1], x[1:]):
            fast.update(part, stride=stride)
            slow.update(part, stride=stride)
        np.testing.assert_array_equal(fast.counts, slow.counts)
        assert (fast.min, fast.max, fast.count, fast.samples) == (
            slow.min,
            slow.max,
            slow.count,
            slow.samples,
        )
        assert fast.sample_max_sum == slow.sample_max_sum and fast.sample_min_sum == 0.0
        if channels:
            np.testing.assert_array_equal(fast.channel_amax, slow.channel_amax)
        again = TensorStats.from_json("t", fast.to_json())
        assert again.nonnegative and again.merge(slow).nonnegative is False


def test_update_peaks_equals_update_on_the_whole_tensor():
    r = np.random.default_rng(8)
    x = np.maximum(r.standard_normal((3, 4, 6, 6)), 0).astype(np.float32)
    whole = TensorStats("t", histogram=False, channels=True, nonnegative=True)
    whole.update(x)
    peaks = TensorStats("t", histogram=False, channels=True, nonnegative=True)
    channel_max = x.max(axis=(2, 3))
    peaks.update_peaks(channel_max.max(axis=1).astype(np.float64), x.size, channel_max=channel_max)
    np.testing.assert_array_equal(peaks.channel_amax, whole.channel_amax)
    assert (peaks.min, peaks.max, peaks.count, peaks.samples, peaks.sample_max_sum) == (
        whole.min,
        whole.max,
        whole.count,
        whole.samples,
        whole.sample_max_sum,
    )


def test_positions_are_counted_by_their_peak_merge_across_shards_and_survive_json():
    # [N, C, T]: 3 of every 4 frames at 1% of the loud ones, one silent frame per sample
    r = np.random.default_rng(9)
    gain = np.where(np.arange(16) % 4 == 0, 1.0, 0.01)
    x = (r.standard_normal((6, 8, 16)) * gain[None, None, :]).astype(np.float32)
    x[:, :, 5] = 0.0
    whole = TensorStats("t", positions=True)
    whole.update(x)
    peaks = np.abs(x).max(axis=1)
    weak, total = whole.weak_positions(1 / 16)
    assert total == 6 * 16
    # the bins are 1/8 octave wide: the count is exact but for peaks within 9% of the bound
    bound = np.abs(x).max() / 16
    quiet = peaks > 0  # an all-zero frame is held exactly by int8: not weak
    assert (quiet & (peaks < bound * 0.91)).sum() <= weak <= (quiet & (peaks < bound)).sum()
    assert weak >= 6 * 11  # the quiet frames, not the silent one
    left, right = TensorStats("t", positions=True), TensorStats("t", positions=True)
    left.update(x[:2])
    right.update(x[2:])
    np.testing.assert_array_equal(left.merge(right).position_counts, whole.position_counts)
    again = TensorStats.from_json("t", whole.to_json())
    np.testing.assert_array_equal(again.position_counts, whole.position_counts)
    assert TensorStats("t").weak_positions() is None
    plain = TensorStats("t")
    plain.update(x)
    assert left.merge(plain).position_counts is None  # one shard without them: no view
    flat = TensorStats("t", positions=True)
    flat.update(x.reshape(6, -1))  # not [N, C, T]: no per-position view
    assert flat.weak_positions() is None


def test_clamped_statistics_move_the_tails_into_the_bounds():
    x = np.random.default_rng(0).normal(0.0, 5.0, 100_000).astype(np.float32)
    stats = observe("t", [x])
    clamped = stats.clamped(-3.0, 8.0)
    assert (clamped.min, clamped.max) == (-3.0, 8.0)
    assert clamped.counts.sum() == stats.counts.sum()  # no value lost
    edges = np.arange(BINS) * (2 * stats.range / BINS) - stats.range  # each bin's low edge
    assert clamped.counts[edges + 2 * stats.range / BINS <= -3.0].sum() == 0
    assert clamped.counts[edges > 8.0].sum() == 0
    assert stats.clamped(-100.0, 100.0) is stats  # nothing beyond: the same statistics
    assert stats.counts.sum() == len(x) and stats.min < -3.0  # the original is untouched


@pytest.mark.parametrize("method", ["minmax", "robust_minmax", "percentile", "mse", "auto"])
def test_a_bound_clips_the_range_and_stays_on_the_grid(method):
    # a conv output over [-35, 145] read by a hardswish: only [-3, 145] matters
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [rng.normal(0.0, 2.0, 50_000), rng.uniform(-35.0, -3.0, 5_000), [145.0]]
    ).astype(np.float32)
    stats = observe("t", [x])
    free = activation_qparams(stats, method, "uint8", symmetric=False)
    qp = activation_qparams(stats, method, "uint8", symmetric=False, bounds=(-3.0, np.inf))
    assert free.low < -3.0 and not free.bound
    assert -3.0 - float(qp.scale) <= qp.low <= -3.0 and "clipped to [-3" in qp.bound
    assert float(qp.scale) < float(free.scale)
    # the grid's lowest value is at or below the bound: a saturated value stays saturated
    assert (0 - int(qp.zero_point)) * float(qp.scale) <= -3.0
    symmetric = activation_qparams(stats, method, "int8", symmetric=True, bounds=(-3.0, np.inf))
    assert symmetric.high <= free.high + 1e-6 and symmetric.bound


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


def _all_fields(stats: TensorStats) -> dict[str, object]:
    out = {}
    for name, value in vars(stats).items():
        out[name] = value.tolist() if isinstance(value, np.ndarray) else value
    return out


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
    st.booleans(),
)
def test_shards_merge_into_exactly_the_statistics_of_one_pass(seed, sizes, nonnegative):
    # every field equal (the sample sums bit for bit), however the batches are split
    r = np.random.default_rng(seed)
    scales = 10.0 ** r.uniform(-3, 3, size=sum(sizes))  # the range grows and shrinks
    batches = [
        (r.standard_normal((2, 3, 5)) * scale).astype(np.float32) for scale in scales.tolist()
    ]
    if nonnegative:
        batches = [np.abs(b) for b in batches]

    def fresh() -> TensorStats:
        return TensorStats("t", channels=True, positions=True, nonnegative=nonnegative)

    whole = fresh()
    for b in batches:
        whole.update(b, stride=2)
    merged, at = fresh(), 0
    for size in sizes:
        shard = fresh()
        for b in batches[at : at + size]:
            shard.update(b, stride=2)
        merged.merge(shard)
        at += size
    assert _all_fields(merged) == _all_fields(whole)
    assert merged.sample_max_sum == whole.sample_max_sum
