"""onnxq.materialize.weight_qparams: a weight's stored qparams."""

from __future__ import annotations

import numpy as np

from onnxq.materialize.weight_qparams import UINT8_MIDPOINT, signed, stored_as
from onnxq.numerics.qparams import QParams


def test_uint8_storage_moves_the_zero_point_and_signed_moves_it_back():
    qp = QParams(np.array([0.1, 0.2], np.float32), np.zeros(2, np.int8), axis=0)
    assert stored_as(qp, "int8") is qp
    stored = stored_as(qp, "uint8")
    assert stored.zero_point.dtype == np.uint8 and (stored.zero_point == UINT8_MIDPOINT).all()
    back = signed(stored)
    assert back.zero_point.dtype == np.int8 and not back.zero_point.any()
    assert signed(qp) is qp
