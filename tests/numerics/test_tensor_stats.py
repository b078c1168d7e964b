"""Streaming statistics: exact histograms however the data is batched or sharded, the native
and numpy paths alike (hypothesis invariants)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxq.errors import CalibrationDataError
from onnxq.numerics import tensor_stats
from onnxq.numerics.observers import METHODS, MethodOptions, get_method
from onnxq.numerics.qparams import (
    activation_qparams,
)
from onnxq.numerics.tensor_stats import BINS, TensorStats

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)
QRANGE = {"int8": (-128, 127), "uint8": (0, 255)}

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
samples = hnp.arrays(np.float32, st.integers(1, 200), elements=finite)


# ------------------------------------------------------------------ statistics
NATIVE = tensor_stats._native  # the compiled histogram update, when it was built at install
needs_native = pytest.mark.skipif(
    NATIVE is None,
    reason="onnxq.numerics._histogram is not built (no C compiler at install, or "
    "ONNXQ_NO_NATIVE=1): only the numpy path can be tested",
)


@contextlib.contextmanager
def histogram_path(path: str):
    """Count histograms with the compiled update (``native``) or with numpy."""
    saved = tensor_stats._native
    tensor_stats._native = NATIVE if path == "native" else None
    try:
        yield
    finally:
        tensor_stats._native = saved


@pytest.fixture(params=["native", "numpy"])
def both_paths(request):
    """Run a test once per histogram path (native skipped where it is not built)."""
    if request.param == "native" and NATIVE is None:
        pytest.skip("onnxq.numerics._histogram is not built")
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
