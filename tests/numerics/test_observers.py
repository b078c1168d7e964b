"""Range methods: the registry and what each method makes of a histogram."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxq.errors import ConfigError
from onnxq.numerics.observers import METHODS, MethodOptions, get_method
from onnxq.numerics.qparams import activation_qparams, range_to_qparams
from tests.numerics.test_tensor_stats import observe

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)
QRANGE = {"int8": (-128, 127), "uint8": (0, 255)}

finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
samples = hnp.arrays(np.float32, st.integers(1, 200), elements=finite)


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
