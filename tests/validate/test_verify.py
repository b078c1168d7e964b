"""The last stage: the float reference it compares with, and when it also runs onnxruntime's
default (fused) session on a model validated unfused."""

from __future__ import annotations

import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.backends import default_session
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.validate.verify import (
    FIDELITY_MODES,
    FloatReference,
    compares_default_session,
    fidelity_mode,
    float_reference,
    verify,
)
from tests import graphs
from tests.numerics.test_precisions import FP8_MISSING

TRT, ORT = PROFILES["tensorrt"], PROFILES["onnxruntime"]


def test_the_float_copy_is_kept_for_timing_only_where_validation_runs_unfused():
    model = graphs.conv_relu()
    held = graphs.random_batches(model, 2)
    payload = ir.serialize(model)
    unfused = float_reference(payload, model, held, TRT)
    assert unfused.outputs is not None and len(unfused.outputs) == 2
    assert unfused.timing_model == payload
    fused = float_reference(payload, model, held, ORT)
    assert fused.outputs is not None and fused.timing_model is None


def test_no_float_copy_or_no_held_batch_gives_no_reference():
    model = graphs.conv_relu()
    assert float_reference(None, model, graphs.random_batches(model, 2), TRT) == FloatReference(
        None
    )
    assert float_reference(ir.serialize(model), model, [], TRT) == FloatReference(None)


def test_a_large_float_model_is_compared_but_not_timed(monkeypatch):
    monkeypatch.setattr(default_session, "TIMING_LIMIT_BYTES", 16)
    model = graphs.conv_relu()
    reference = float_reference(ir.serialize(model), model, graphs.random_batches(model, 2), TRT)
    assert reference.outputs is not None and reference.timing_model is None


def _quantized(backend: str, **options: object) -> tuple[onnx.ModelProto, list]:
    model = graphs.conv_relu()
    held = graphs.random_batches(model, 4)
    result = onnxq.quantize(model, held, backend=backend, progress=False, **options)
    return result.model, held


@pytest.mark.parametrize(
    ("backend", "options", "runs"),
    [
        ("tensorrt", {}, True),  # validated unfused, holds Q/DQ
        ("onnxruntime", {}, False),  # already validated fused
        ("tensorrt", {"exclude": ["*"]}, False),  # nothing quantized: the float model itself
    ],
)
def test_the_default_session_runs_for_a_qdq_model_validated_unfused(backend, options, runs):
    model, held = _quantized(backend, **options)
    float_model = graphs.conv_relu()
    profile = PROFILES[backend]
    reference = float_reference(ir.serialize(float_model), float_model, held, profile)
    verification = verify(model, reference, held, profile)
    assert (verification.default_session is not None) == runs
    if runs:
        view = verification.default_session
        assert view is not None and view.latency is not None and view.failure is None
        assert [o.name for o in view.outputs] == [f.name for f in verification.fidelity]


def test_the_fidelity_mode_says_how_the_model_runs():
    dynamic = QuantConfig(backend="onnxruntime", dynamic=True).backend_profile()[0]
    assert fidelity_mode(TRT) == FIDELITY_MODES["unfused"]
    assert fidelity_mode(ORT) == FIDELITY_MODES["fused"]
    assert fidelity_mode(dynamic) == FIDELITY_MODES["dynamic"]
    assert "dynamic int8 kernels" in fidelity_mode(dynamic)


@pytest.mark.skipif(FP8_MISSING is not None, reason=FP8_MISSING or "")
def test_an_fp8_model_is_neither_timed_nor_compared_in_the_default_session():
    # onnxruntime 1.32's default session computes FP8 Q/DQ wrong (its validation note says so)
    fp8 = QuantConfig(precision="fp8").backend_profile()[0]
    assert not compares_default_session(fp8) and compares_default_session(TRT)
    model, held = _quantized("tensorrt", precision="fp8")
    float_model = graphs.conv_relu()
    reference = float_reference(ir.serialize(float_model), float_model, held, fp8)
    assert reference.outputs is not None and reference.timing_model is None
    verification = verify(model, reference, held, fp8)
    assert verification.default_session is None and verification.fidelity


def test_a_dynamic_run_without_data_says_so():
    dynamic = QuantConfig(backend="onnxruntime", dynamic=True).backend_profile()[0]
    model = onnxq.quantize(graphs.matmul_stack(), backend="onnxruntime", dynamic=True).model
    verification = verify(model, FloatReference(None), [], dynamic)
    assert verification.unmeasured == "no batches held (dynamic)"
