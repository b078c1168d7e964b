"""The dynamic kernels' weight scales: one per column, or one per tensor where that rounds the
weight with the SQNR the profile asks for."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.dynamic_weights import KernelWeights, column_sqnr
from onnxq.observers import weight_qparams
from tests import graphs


def even_weight(seed: int = 0) -> np.ndarray:
    return graphs.weight(graphs.rng(seed), 128, 96)


def loud_weight(seed: int = 0) -> np.ndarray:
    w = even_weight(seed)
    w[:, :4] *= 40  # a few loud columns: one scale rounds the rest coarsely
    return w


def worst(w: np.ndarray, axis: int | None, qmax: int = 127) -> float:
    return float(column_sqnr(w, weight_qparams(w, axis, qmax), qmax).min())


def test_column_sqnr_is_infinite_for_exact_values_and_drops_6_db_per_bit():
    exact = np.array([[0.0, 1.0], [2.0, -127.0]], np.float32)
    assert np.isinf(column_sqnr(exact, weight_qparams(exact, None, 127), 127)).all()
    w = even_weight()
    assert 5.0 < worst(w, None, 127) - worst(w, None, 63) < 7.0


def test_one_scale_rounds_the_quiet_columns_beside_loud_ones_coarsely():
    w = loud_weight()
    sqnr = column_sqnr(w, weight_qparams(w, None, 127), 127)
    assert sqnr[:4].min() > 40 and sqnr[4:].max() < 13  # 40x quieter: 32 dB lost
    assert worst(w, 1) > worst(w, None) + 25


def test_no_threshold_keeps_per_column_scales():
    qp = KernelWeights(127, "minmax").matrix_qparams(even_weight())
    assert qp.axis == 1 and qp.scale.shape == (96,)


@pytest.mark.parametrize(("qmax", "axis"), [(127, None), (63, 1)])
def test_one_scale_where_it_rounds_the_weight_well_enough(qmax, axis):
    # even columns: one scale rounds the worst with ~30 dB at 8 bits, ~6 dB less at 7 (x86-avx2)
    w = even_weight()
    threshold = worst(w, None, 127) - 1.0
    qp = KernelWeights(qmax, "minmax", threshold).matrix_qparams(w)
    assert qp.axis == axis
    assert (qp.scale.shape == ()) == (axis is None)


def test_loud_columns_keep_per_column_scales():
    w = loud_weight()
    threshold = worst(even_weight(), None) - 1.0
    assert KernelWeights(127, "minmax", threshold).matrix_qparams(w).axis == 1
