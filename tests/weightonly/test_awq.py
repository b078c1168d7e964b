"""AWQ: activation-aware input scales lower the output error against round to nearest."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import onnxq
from onnxq.numerics.blocks import BlockFormat, output_error, quantize_rtn
from onnxq.weightonly.awq import channel_scales, search_scales
from tests.weightonly import models


def test_channel_scales_have_a_geometric_mean_of_one_and_alpha_zero_is_identity():
    m = np.array([0.1, 1.0, 10.0, 100.0])
    assert np.allclose(channel_scales(m, 0.0), 1.0)
    s = channel_scales(m, 0.5)
    assert np.isclose(s.max() * s.min(), 1.0, rtol=1e-5) and np.all(np.diff(s) > 0)


def test_search_never_does_worse_than_its_clipping_alone_and_beats_rtn():
    r = np.random.default_rng(0)
    x = r.standard_normal((2048, 64)).astype(np.float32)
    x[:, :4] *= 30.0
    w = (r.standard_normal((64, 32)) * 0.05).astype(np.float32)
    h = (x.T @ x).astype(np.float64)
    fmt = BlockFormat(4, 32, True)
    s, _ = search_scales([w], h, np.abs(x).mean(0), fmt)
    rtn = output_error(w, quantize_rtn(w, fmt).dequantize(), h)
    clip_only = output_error(w, quantize_rtn(w, fmt, importance=np.diag(h)).dequantize(), h)
    scaled = (
        quantize_rtn(w * s[:, None], fmt, importance=np.diag(h) / s**2).dequantize() / s[:, None]
    )
    assert output_error(w, scaled, h) <= clip_only * (1 + 1e-6) < rtn


def test_awq_through_a_tiny_graph_beats_rtn():
    m = models.linear()
    batches = models.loud_inputs()
    x = batches[0]["x"]
    ref = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    errors = {}
    for algorithm in ("rtn", "awq"):
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
    assert errors["awq"] < errors["rtn"]


def test_awq_scales_fold_into_the_normalisation_gain():
    """The projections' input is a constant Mul (an RMSNorm gain) that only they read: the
    scales go into that constant, no Mul node is added."""
    m = models.decoder()
    q = onnxq.quantize(
        m,
        models.token_batches(),
        weight_only="int4",
        block_size=32,
        weight_algorithm="awq",
        backend="onnxruntime",
        progress=False,
    )
    muls = [n for n in q.model.graph.node if n.op_type == "Mul"]
    assert len(muls) <= sum(n.op_type == "Mul" for n in m.graph.node) + 1  # down_proj's own
    ids = models.token_batches(1, seed=5)[0]
    ref = ort.InferenceSession(m.SerializeToString()).run(None, ids)[0]
    got = ort.InferenceSession(q.model.SerializeToString()).run(None, ids)[0]
    cos = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cos > 0.98
