"""GPTQ: lower output error than round to nearest, on the layer and through a tiny graph."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxq
from onnxq.numerics.blocks import BlockFormat, output_error, quantize_rtn
from onnxq.weightonly.gptq import gptq, inverse_factor
from tests.weightonly import models


def _layer(seed: int = 0):
    r = np.random.default_rng(seed)
    mix = np.eye(96) + 0.4 * r.standard_normal((96, 96))
    x = (r.standard_normal((1024, 96)) @ mix).astype(np.float32)
    w = (r.standard_normal((96, 40)) * 0.05).astype(np.float32)
    return w, (x.T @ x).astype(np.float64)


@pytest.mark.parametrize("block", [32, None])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_lowers_the_output_error_against_rounding(block, symmetric, act_order):
    w, h = _layer()
    fmt = BlockFormat(4, block, symmetric)
    rtn = output_error(w, quantize_rtn(w, fmt, importance=np.diag(h)).dequantize(), h)
    q = gptq(w, h, fmt, act_order=act_order)
    assert q.q.min() >= fmt.qmin and q.q.max() <= fmt.qmax
    assert output_error(w, q.dequantize(), h) < 0.8 * rtn


def test_inverse_factor_is_the_upper_cholesky_factor_of_the_damped_inverse():
    _, h = _layer(1)
    u = inverse_factor(h, 0.01)
    damped = h + np.eye(len(h)) * 0.01 * np.mean(np.diag(h))
    assert np.allclose(np.triu(u), u)
    assert np.allclose(u.T @ u, np.linalg.inv(damped), rtol=1e-6, atol=1e-9)


def test_a_singular_hessian_still_gives_a_factor():
    h = np.zeros((8, 8))
    h[:4, :4] = np.eye(4)  # four dead input channels
    assert np.all(np.isfinite(inverse_factor(h, 0.01)))


def test_gptq_through_a_tiny_graph_beats_rtn(tmp_path):
    """The layer's output in onnxruntime, float vs quantized: GPTQ's error is lower."""
    m = models.linear()
    batches = models.loud_inputs()
    x = batches[0]["x"]
    ref = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    errors = {}
    for algorithm in ("rtn", "gptq"):
        q = onnxq.quantize(
            m,
            batches,
            weight_only="int4",
            block_size=32,
            weight_algorithm=algorithm,
            backend="onnxruntime",
            weight_accuracy_level=0,
            progress=False,
        )
        out = ort.InferenceSession(q.model.SerializeToString()).run(None, {"x": x})[0]
        errors[algorithm] = float(np.mean((out - ref) ** 2))
    assert errors["gptq"] < 0.8 * errors["rtn"]
