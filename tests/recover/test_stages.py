"""The recovery steps as the pipeline calls them: the ``--target`` search scored on the
quantized-prefix statistics when ``calibration_mode`` is ``prefix``."""

from __future__ import annotations

import numpy as np

import onnxq
from onnxq.calibrate.engine import CalibrationResult
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.recover.stages import Overlaid
from tests import graphs
from tests.mixed.test_search import conv_chain


def stats(peak: float) -> TensorStats:
    return TensorStats("t", min=-peak, max=peak)


def test_overlaid_statistics_replace_the_measured_ones_of_their_tensors():
    calls = []

    def measure(wanted):
        calls.append(dict(wanted))
        return CalibrationResult({"a": stats(1.0), "b": stats(2.0)}, 3, [])

    prefix = CalibrationResult({"b": stats(5.0)}, 3, [])
    result = Overlaid(measure, prefix)({"a": True, "b": True})
    assert result.stats["a"].max == 1.0 and result.stats["b"].max == 5.0
    assert result.batches_seen == 3 and calls == [{"a": True, "b": True}]


def test_the_target_search_starts_from_the_prefix_ranges():
    m = conv_chain()
    data = graphs.random_batches(m, 16)
    common = {"progress": False, "target": "cosine=0.0"}
    plain = onnxq.quantize(m, data, **common).report
    prefix = onnxq.quantize(m, data, calibration_mode="prefix", **common).report
    assert prefix.recovery["search_on_prefix_ranges"] is True
    assert "search_on_prefix_ranges" not in plain.recovery
    # the all-INT8 score the search starts from is the prefix-calibrated model's
    assert prefix.mixed_precision is not None and plain.mixed_precision is not None
    assert prefix.mixed_precision["int8_score"] != plain.mixed_precision["int8_score"]
    direct = onnxq.quantize(m, data[4:], calibration_mode="prefix", progress=False)
    held = data[:4]  # the target's held-out batches: the first quarter
    got = np.concatenate([_run(direct.model, b).ravel() for b in held])
    want = np.concatenate([_run(m, b).ravel() for b in held])
    cosine = _cosine(got, want)
    np.testing.assert_allclose(prefix.mixed_precision["int8_score"], cosine, atol=2e-6)


def _run(model, batch):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts)
    return session.run(None, batch)[0].astype(np.float64)


def _cosine(a, b):
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))
