"""Run-time validation: outputs in onnxruntime and fidelity against the float model."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.backends.validate import OutputFidelity, fidelity, run_outputs, validation_session
from onnxq.calibrate import make_session
from onnxq.errors import BackendConstraintError, UnsupportedModelError
from tests import graphs


def test_run_outputs_per_batch_from_a_model_or_a_session():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 2)
    from_model = run_outputs(model, batches, fused=False, what="float")
    from_session = run_outputs(make_session(model), batches, fused=True, what="float")
    assert len(from_model) == 2 and set(from_model[0]) == {"y"}
    for a, b in zip(from_model, from_session, strict=True):
        np.testing.assert_allclose(a["y"], b["y"], rtol=1e-5, atol=1e-6)


def test_run_outputs_failure_names_the_model_and_batch():
    model = graphs.conv_relu()
    batches = [graphs.random_inputs(model), {"x": np.zeros((1, 16, 4, 4), np.float32)}]
    with pytest.raises(
        BackendConstraintError, match="the quantized model fails in onnxruntime on held batch 1"
    ):
        run_outputs(model, batches, fused=False, what="quantized")


def test_validation_sessions_run_nodes_in_the_models_priority_order():
    """onnxruntime's default order runs every weight's DequantizeLinear before the first
    MatMul: an unfused model would then hold all its weights in float at once."""
    import onnxruntime as ort

    for fused in (False, True):
        opts = validation_session(graphs.conv_relu(), fused).get_session_options()
        assert opts.execution_order == ort.ExecutionOrder.PRIORITY_BASED
        assert opts.graph_optimization_level == (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL if fused
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def test_validation_session_load_failure_names_the_model():
    model = graphs.conv_relu()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="cannot load the quantized model"):
        validation_session(model, fused=False)


def test_fidelity_of_identical_outputs_is_perfect():
    ref = [{"y": np.array([1.0, -2.0, 3.0], np.float32)}]
    (fid,) = fidelity(ref, ref)
    assert fid == OutputFidelity("y", 1.0, 0.0, 3.0)


def test_fidelity_measures_cosine_and_max_error_over_all_batches():
    ref = [{"y": np.array([1.0, 0.0])}, {"y": np.array([0.0, 1.0])}]
    got = [{"y": np.array([1.0, 0.0])}, {"y": np.array([0.0, -1.0])}]
    (fid,) = fidelity(ref, got)
    assert fid.cosine == 0.0 and fid.max_abs_error == 2.0 and fid.float_max_abs == 1.0


def test_fidelity_of_integer_outputs_is_the_agreement_rate():
    ref = [{"ids": np.array([1, 2])}, {"ids": np.array([3, 4])}]
    got = [{"ids": np.array([1, 2])}, {"ids": np.array([3, 5])}]
    assert fidelity(ref, got) == [OutputFidelity("ids", 0.5, 0.0, 0.0, "agreement")]


def test_fidelity_of_label_maps_compares_their_values_and_skips_other_outputs():
    # scikit-learn's ZipMap: one {label: probability} map per sample
    ref = [{"p": [{0: 0.9, 1: 0.1}, {0: 0.2, 1: 0.8}], "s": [np.zeros(2, np.float32)]}]
    got = [{"p": [{0: 0.8, 1: 0.2}, {0: 0.2, 1: 0.8}], "s": [np.ones(2, np.float32)]}]
    maps, other = fidelity(ref, got)
    want = np.array([0.9, 0.1, 0.2, 0.8]) @ np.array([0.8, 0.2, 0.2, 0.8]) / (
        np.linalg.norm([0.9, 0.1, 0.2, 0.8]) * np.linalg.norm([0.8, 0.2, 0.2, 0.8]))
    assert maps.compared == "cosine" and maps.cosine == pytest.approx(want, abs=1e-6)
    assert maps.max_abs_error == pytest.approx(0.1) and maps.float_max_abs == 0.9
    assert other.compared == "not compared: a list output, not a numeric tensor"


def test_fidelity_leaves_nan_and_inf_out_and_counts_where_the_models_disagree_on_them():
    ref = [{"y": np.array([1.0, np.nan, np.inf, 2.0, -np.inf])}]
    same = [{"y": np.array([1.0, np.nan, np.inf, 2.5, -np.inf])}]
    (fid,) = fidelity(ref, same)
    want = (1.0 + 5.0) / (np.sqrt(5.0) * np.sqrt(7.25))
    assert fid.cosine == pytest.approx(want, abs=1e-6) and fid.max_abs_error == 0.5
    assert (fid.float_max_abs, fid.nonfinite, fid.nonfinite_mismatch) == (2.0, 3, 0)
    # finite where the float model is not, NaN where it is finite, Inf against -Inf
    other = [{"y": np.array([np.nan, 3.0, np.inf, 2.0, np.inf])}]
    (fid,) = fidelity(ref, other)
    assert (fid.nonfinite, fid.nonfinite_mismatch) == (3, 3) and fid.cosine == 1.0
    assert np.isfinite([fid.cosine, fid.max_abs_error, fid.float_max_abs]).all()


def test_fidelity_of_all_zero_outputs():
    zeros = [{"y": np.zeros(3)}]
    assert fidelity(zeros, zeros)[0].cosine == 1.0
    assert fidelity(zeros, [{"y": np.ones(3)}])[0].cosine == 0.0
    assert fidelity([], []) == []
