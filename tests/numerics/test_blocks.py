"""Block formats, round to nearest with the clip search, dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxq.numerics.blocks import BlockFormat, block_params, output_error, quantize_rtn


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block", [16, 32, None])
def test_codes_stay_in_range_and_dequantize_within_half_a_step(bits, symmetric, block):
    r = np.random.default_rng(0)
    w = r.standard_normal((72, 24)).astype(np.float32)  # 72: blocks of 16 and 32 leave a short one
    fmt = BlockFormat(bits, block, symmetric)
    q = quantize_rtn(w, fmt, clip=False)
    assert q.q.min() >= fmt.qmin and q.q.max() <= fmt.qmax
    assert q.scale.shape == (fmt.blocks(72), 24) and np.all(q.scale > 0)
    step = np.repeat(q.scale, fmt.rows(72), axis=0)[:72]
    assert np.all(np.abs(q.dequantize() - w) <= step / 2 + 1e-6)


def test_symmetric_codes_have_no_zero_point_and_asymmetric_ones_do():
    w = np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32)
    assert quantize_rtn(w, BlockFormat(4, 16, True)).zero_point is None
    asym = quantize_rtn(w, BlockFormat(4, 16, False))
    assert asym.zero_point is not None and asym.zero_point.shape == (2, 8)
    assert asym.q.dtype == np.uint8 and quantize_rtn(w, BlockFormat(4, 16, True)).q.dtype == np.int8


def test_clip_search_never_loses_to_the_full_range_under_its_weighting():
    r = np.random.default_rng(2)
    w = (r.standard_t(3, size=(128, 64)) * 0.05).astype(np.float32)  # heavy tails
    importance = r.random(128).astype(np.float32) + 0.1
    fmt = BlockFormat(4, 32, True)
    full = quantize_rtn(w, fmt, importance=importance, clip=False).dequantize()
    searched = quantize_rtn(w, fmt, importance=importance).dequantize()
    weighted = lambda d: float(((d - w) ** 2 * importance[:, None]).sum())  # noqa: E731
    assert weighted(searched) < weighted(full)


def test_clip_search_lowers_a_layers_output_error_against_plain_rounding():
    """RTN's clip search, weighted by the inputs' mean square, on a layer whose inputs have a
    few loud channels: the output error |X dW| drops against rounding each block's range."""
    r = np.random.default_rng(3)
    x = r.standard_normal((512, 64)).astype(np.float32)
    x[:, :4] *= 10
    w = (r.standard_t(3, size=(64, 32)) * 0.05).astype(np.float32)
    h = (x.T @ x).astype(np.float64)
    fmt = BlockFormat(4, 32, True)
    plain = quantize_rtn(w, fmt, clip=False).dequantize()
    searched = quantize_rtn(w, fmt, importance=np.diag(h)).dequantize()
    assert output_error(w, searched, h) < output_error(w, plain, h)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 70),
    st.integers(1, 9),
    st.sampled_from([None, 16, 32]),
    st.booleans(),
    st.floats(1e-3, 1e3),
)
def test_scales_are_positive_for_any_weight(k, n, block, symmetric, magnitude):
    w = (np.random.default_rng(k * 31 + n).standard_normal((k, n)) * magnitude).astype(np.float32)
    w[0] = 0.0  # an all-zero row, and for k == 1 an all-zero block
    scale, zero = block_params(w, BlockFormat(4, block, symmetric))
    assert np.all(scale > 0) and np.all(np.isfinite(scale))
    if zero is not None:
        assert np.all((zero >= 0) & (zero <= 15))


@pytest.mark.parametrize("symmetric", [True, False])
def test_block_params_of_column_slices_equal_the_search_over_the_whole_weight(
    monkeypatch: pytest.MonkeyPatch, symmetric: bool
) -> None:
    """Each column's scale is its own choice: the search in slices (how a large weight is
    handled) gives exactly the whole weight's figures."""
    from onnxq.numerics import blocks

    rng = np.random.default_rng(3)
    w = rng.standard_t(4, size=(96, 50)).astype(np.float32)
    importance = rng.random(96).astype(np.float32)
    fmt = BlockFormat(4, 32, symmetric)
    whole = block_params(w, fmt, importance)
    monkeypatch.setattr(blocks, "CHUNK_BYTES", 4 * 96 * 7)  # slices of 7 columns
    sliced = block_params(w, fmt, importance)
    assert np.array_equal(whole[0], sliced[0])
    assert (whole[1] is None) == symmetric == (sliced[1] is None)
    if not symmetric:
        assert np.array_equal(whole[1], sliced[1])


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_squared_error_in_one_buffer_equals_fake_quantizing_and_subtracting(symmetric, weighted):
    from onnxq.numerics.blocks import _candidate, _squared_error, to_blocks

    r = np.random.default_rng(5)
    fmt = BlockFormat(4, 16, symmetric)
    blocks = to_blocks(r.standard_normal((40, 6)).astype(np.float32), fmt)  # a short last block
    lo, hi = np.minimum(blocks.min(axis=1), 0.0), np.maximum(blocks.max(axis=1), 0.0)
    if symmetric:
        lo = hi = np.abs(blocks).max(axis=1)
    scale, zero = _candidate(lo, hi, 0.8, fmt)
    weight = to_blocks(r.random((40, 1)).astype(np.float32), fmt) if weighted else None
    s, z = scale[:, None], None if zero is None else zero[:, None]
    codes = np.rint(blocks / s) if z is None else np.rint(blocks / s) + z
    codes = np.clip(codes, fmt.qmin, fmt.qmax)
    deq = codes * s if z is None else (codes - z) * s
    expected = (deq - blocks) ** 2
    expected = (expected * weight if weight is not None else expected).sum(axis=1)
    work = np.full_like(blocks, np.nan)  # whatever the buffer held before
    got = _squared_error(blocks, scale, zero, weight, fmt, work)
    assert np.array_equal(got, expected)
