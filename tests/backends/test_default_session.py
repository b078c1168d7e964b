"""What onnxruntime's default session shows for a TensorRT-targeted output on this machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

import onnxq
from onnxq.backends import default_session
from onnxq.backends.cpu import ENV_VAR
from onnxq.backends.default_session import FusedFidelity, Latency, time_default_sessions
from onnxq.backends.validate import OutputFidelity
from onnxq.cli import main
from tests import graphs


def fixed_timer(float_s: float, quantized_s: float):
    """A timer that runs nothing and says each model took a fixed time."""
    calls: list[str] = []

    def timer(label, run):
        calls.append(label)
        return {"float": float_s, "quantized": quantized_s}[label]

    timer.calls = calls  # type: ignore[attr-defined]
    return timer


@pytest.mark.parametrize(
    ("unfused", "fused", "beyond"),
    [
        (0.990, 0.700, True),  # the EfficientNet-Lite-style classifier on an AVX2 machine
        (0.9667, 0.9433, True),  # mobilenet_v2's TensorRT output, AVX2 kernels (qemu)
        (0.9667, 0.9645, False),  # the same with VNNI: rounding noise
        (0.9884, 0.9838, False),  # its onnxruntime output: fused requantization
        (0.99990, 0.99850, False),  # 15x the error, but 0.15% of the signal
        (0.99990, 0.99700, True),
    ],
)
def test_fused_beyond_noise(unfused, fused, beyond):
    got = default_session._compare(
        OutputFidelity("y", unfused, 0.1, 1.0), OutputFidelity("y", fused, 0.5, 1.0)
    )
    assert got == FusedFidelity("y", "cosine", unfused, fused, beyond_noise=beyond)


def _corrupt_fused_outputs(monkeypatch):
    """Make the fused run return what saturated int16 sums would: the outputs halved where
    they are large."""
    real = default_session.run_outputs

    def run_outputs(model, batches, fused, what):
        outs = real(model, batches, fused, what)
        return [{k: np.where(v > 0.5, v / 2, v) for k, v in o.items()} for o in outs]

    monkeypatch.setattr(default_session, "run_outputs", run_outputs)


@pytest.mark.parametrize(("machine", "why"), [("x86-avx2", "int16 sums"), ("x86-vnni", "round")])
def test_a_fused_disagreement_gives_both_figures_why_and_what_to_do(monkeypatch, machine, why):
    monkeypatch.setenv(ENV_VAR, machine)
    _corrupt_fused_outputs(monkeypatch)
    model = graphs.conv_relu()
    report = onnxq.quantize(model, graphs.random_batches(model, 8), progress=False).report
    view = report.default_session
    assert view is not None and view.cpu == machine and view.disagrees
    (out,) = view.outputs
    assert out.unfused == report.fidelity[0].cosine and out.fused < out.unfused - 0.01
    (warning,) = [w for w in report.warnings if "default session" in w]
    assert f"on this machine ({machine})" in warning and why in warning
    assert f"cosine {out.unfused:.3f} unfused, cosine {out.fused:.3f} fused" in warning
    assert warning.endswith("quantize with --backend onnxruntime")
    assert "against" in report.summary() and "Q/DQ fused" in report.summary()
    saved = json.loads(report.to_json())["fidelity"]["onnxruntime_default_session"]
    assert saved["differs_beyond_noise"] and saved["outputs"][0]["fused"] == out.fused


def test_agreeing_sessions_say_nothing():
    model = graphs.conv_relu()
    report = onnxq.quantize(model, graphs.random_batches(model, 8), progress=False).report
    assert report.default_session is not None and not report.default_session.disagrees
    assert not any("default session" in w for w in report.warnings)


def test_an_onnxruntime_output_is_already_measured_fused():
    model = graphs.conv_relu()
    report = onnxq.quantize(
        model, graphs.random_batches(model, 4), backend="onnxruntime", progress=False
    ).report
    assert report.default_session is None


def test_the_sessions_take_turns_and_the_medians_are_compared():
    model = graphs.conv_relu()
    timer = fixed_timer(0.001, 0.003)
    latency = time_default_sessions(
        model.SerializeToString(), model, graphs.random_inputs(model), timer
    )
    assert latency == Latency(1.0, 3.0, default_session.TIMING_PAIRS)
    assert timer.calls[:4] == ["float", "quantized", "float", "quantized"]
    assert len(timer.calls) == 2 * (default_session.TIMING_PAIRS + 1)  # one warm-up pair


def test_timing_stops_at_its_budget():
    model = graphs.conv_relu()
    latency = time_default_sessions(
        model.SerializeToString(), model, graphs.random_inputs(model), fixed_timer(1.0, 1.5)
    )
    assert latency.pairs == 1


@pytest.mark.parametrize(("quantized_s", "slower"), [(0.0025, True), (0.00105, False)])
def test_a_slower_output_is_said_once_by_the_cli_but_kept_out_of_the_report_file(
    monkeypatch, tmp_path, capsys, model_file, calib_dir, quantized_s, slower
):
    monkeypatch.setattr(default_session, "perf_counter_timer", fixed_timer(0.001, quantized_s))
    path, calib = model_file(graphs.conv_relu()), calib_dir(graphs.conv_relu())
    out, report = tmp_path / "q.onnx", tmp_path / "r.json"
    code = main(
        ["quantize", str(path), "-o", str(out), "--calib", str(calib), "--report", str(report)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "latency in onnxruntime's default session on this" in printed
    said = [line for line in printed.splitlines() if "slower than the float model" in line]
    assert len(said) == (1 if slower else 0)
    if slower:
        assert "runs 2.50x slower than the float model (2.5 ms against 1 ms" in said[0]
    text = report.read_text()
    assert "slower than the float model" not in text and "latency" not in text
    assert main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    assert capsys.readouterr().err.count("slower than the float model") == (1 if slower else 0)


def test_a_model_the_default_session_cannot_run_gets_a_warning_not_an_error(monkeypatch):
    from onnxq.errors import UnsupportedModelError

    real = default_session.run_outputs

    def run_outputs(model, batches, fused, what):
        if fused:
            raise UnsupportedModelError("the quantized model fails in onnxruntime on held batch 0")
        return real(model, batches, fused, what)

    monkeypatch.setattr(default_session, "run_outputs", run_outputs)
    model = graphs.conv_relu()
    report = onnxq.quantize(model, graphs.random_batches(model, 4), progress=False).report
    (warning,) = [w for w in report.warnings if "default session" in w]
    assert "cannot run this model, though its Q/DQ graph runs" in warning
    assert report.fidelity[0].cosine > 0.9  # measured unfused as before
