"""Property: on any valid float graph, ``onnxq.quantize`` either returns a model that is valid,
runs, conforms to its backend and stays close to the float model, or raises an ``OnnxqError``.
Never an ``InternalError`` or any other exception.

The error bound.  Per float output, over all calibration batches (the data whose ranges set the
scales: the bound is about quantization error, not about how well 4 random batches predict the
range of a fifth), ``||q - f||_2 / ||f||_2 <= 0.2``:

* one int8 quantize/dequantize of a tensor calibrated to its range adds uniform noise of
  ``step / sqrt(12)``, ~0.3% of the range; per-channel int8 weights add about as much; a
  percentile clip (99.99th) touches a handful of values; so one quantized Conv/Gemm/MatMul costs
  ~0.5-2% relative L2 error (7-bit weights on CPUs without VNNI: about twice that);
* the generated graphs have at most 8 ops, so at most ~8 such layers in sequence; independent
  errors add in quadrature (~3-6%), a correlated worst case adds linearly (~15%);
* 0.2 leaves room for that worst case while any real placement bug (wrong axis, wrong scale,
  a wrong consumer rewired, a dropped bias) gives errors of order 1.

Outputs whose float RMS is below 1e-3 (all-zero after a ReLU, a constant) are *degenerate*: a
relative error means nothing there, so only finiteness and shape are checked.  When an ``If``
condition computed from an activation differs between the float and quantized runs (the sum sat
within quantization noise of 0), the branch legitimately flipped and the bound is not applied.

Some ``OnnxqError`` messages admit that onnxq itself is at fault (its own validation failed on a
model that, by construction, is valid and runs): those count as failures too (``BUG_MARKERS``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import helper, numpy_helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from tests.fuzzgraphs import FuzzCase, fuzz_cases

BACKENDS = ("tensorrt", "onnxruntime")
REL_L2_BOUND = 0.2
DEGENERATE_RMS = 1e-3
CALIB_BATCHES = 4
# an OnnxqError with one of these in its message blames onnxq, not the (valid) input
BUG_MARKERS = ("bug in onnxq", "please report", "onnxruntime cannot load", "failed on it",
               "fails in onnxruntime", "simplify pass", "needs a DAG")


class PropertyViolation(AssertionError):
    """The quantized model (or the error onnxq raised) breaks the property."""


@dataclass(frozen=True)
class Outcome:
    """What happened to one (case, backend): ``kind`` is ok, ok-flip or onnxq-error."""

    kind: str
    detail: str = ""
    worst_rel_error: float = 0.0
    qdq_nodes: int = 0


def session(model: onnx.ModelProto, optimize: bool = True) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def error_stem(exc: BaseException) -> str:
    """The message without names and numbers, for grouping."""
    import re

    text = re.sub(r"'[^']*'", "'…'", str(exc))
    text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return f"{type(exc).__name__}: {text[:120]}"


def quantize_property(case: FuzzCase, backend: str) -> Outcome:
    """Run the property; returns the outcome or raises :class:`PropertyViolation`.

    Exceptions other than OnnxqError propagate unchanged (with their traceback)."""
    calib = case.batches(CALIB_BATCHES)
    try:
        result = onnxq.quantize(case.model, calib, backend=backend, progress=False)
    except onnxq.OnnxqError as exc:
        if any(marker in str(exc) for marker in BUG_MARKERS):
            raise PropertyViolation(f"{type(exc).__name__} blaming onnxq: {exc}") from exc
        return Outcome("onnxq-error", error_stem(exc))
    q = result.model
    try:
        onnx.checker.check_model(q, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise PropertyViolation(f"quantized model fails onnx.checker: {exc}") from exc
    violations = check(q, PROFILES[backend])
    if violations:
        raise PropertyViolation(f"{len(violations)} {backend} violations, first: "
                                f"{violations[0]}")
    # what the user runs (optimizations on) must load and run; the error is measured like onnxq
    # measures it: fused int8 kernels for onnxruntime, the Q/DQ graph's own math for TensorRT
    try:
        default = session(q)
        measured = default if backend == "onnxruntime" else session(q, optimize=False)
    except Exception as exc:
        raise PropertyViolation(f"onnxruntime cannot load the quantized model: {exc}") from exc
    # the float reference runs at the same optimization level as the measured quantized model
    reference = session(case.model, optimize=backend == "onnxruntime")
    names = [o.name for o in case.model.graph.output]
    if [o.name for o in q.graph.output] != names:
        raise PropertyViolation(f"outputs changed: {[o.name for o in q.graph.output]} != {names}")
    evaluation = calib  # the batches whose ranges set the scales (see the module docstring)
    try:
        default.run(names, evaluation[0])
        got = [measured.run(names, batch) for batch in evaluation]
    except Exception as exc:
        raise PropertyViolation(f"the quantized model fails in onnxruntime: {exc}") from exc
    want = [reference.run(names, batch) for batch in evaluation]
    flipped = False
    worst = 0.0
    for i, name in enumerate(names):
        f = np.concatenate([w[i].ravel() for w in want])
        g = np.concatenate([o[i].ravel() for o in got])
        if f.shape != g.shape or want[0][i].shape != got[0][i].shape:
            raise PropertyViolation(f"output {name}: shape {got[0][i].shape} != "
                                    f"{want[0][i].shape}")
        if f.dtype.kind != "f":
            flipped |= not np.array_equal(f, g)
            continue
        if not np.isfinite(g).all():
            raise PropertyViolation(f"output {name}: non-finite values")
        f64, g64 = f.astype(np.float64), g.astype(np.float64)
        rms = float(np.sqrt(np.mean(f64**2))) if f.size else 0.0
        if rms < DEGENERATE_RMS:
            continue
        rel = float(np.linalg.norm(g64 - f64) / np.linalg.norm(f64))
        worst = max(worst, rel) if not flipped else worst
        if rel > REL_L2_BOUND:
            worst = max(worst, rel)
            if not _branch_flipped(names, want, got):
                raise PropertyViolation(
                    f"output {name}: relative L2 error {rel:.3f} > {REL_L2_BOUND} (float RMS "
                    f"{rms:.3g}, max |error| {np.max(np.abs(g64 - f64)):.3g})")
            flipped = True
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in q.graph.node)
    return Outcome("ok-flip" if flipped else "ok", worst_rel_error=worst, qdq_nodes=qdq)


def _branch_flipped(names: list[str], want, got) -> bool:
    """True if any bool output (an exposed If condition) differs between float and quantized."""
    for i, _ in enumerate(names):
        for w, g in zip(want, got, strict=True):
            if w[i].dtype == np.bool_ and not np.array_equal(w[i], g[i]):
                return True
    return False


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@given(case=fuzz_cases())
def test_quantize_returns_a_good_model_or_an_onnxq_error(backend, case):
    # 100 examples per backend: 200 quantizations in all
    quantize_property(case, backend)


# ------------------------------------------------------------------------------- found by fuzzing
def if_reads_pooled_conv() -> onnx.ModelProto:
    """Conv -> MaxPool whose output only an If branch reads (an implicit subgraph input)."""
    vi = helper.make_tensor_value_info
    r = np.random.default_rng(0)
    shape = [1, 16, 8, 8]
    then_g = helper.make_graph([helper.make_node("Relu", ["pooled"], ["t"])], "then", [],
                               [vi("t", onnx.TensorProto.FLOAT, shape)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["pooled"], ["e"])], "else", [],
                               [vi("e", onnx.TensorProto.FLOAT, shape)])
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["conv"], ["pooled"], name="pool", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g,
                         else_branch=else_g),
    ]
    inits = [numpy_helper.from_array((r.standard_normal((16, 16, 3, 3)) * 0.1).astype(
                 np.float32), "w"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b"),
             numpy_helper.from_array(np.float32(0), "zero")]
    graph = helper.make_graph(nodes, "if_pool", [vi("x", onnx.TensorProto.FLOAT, shape)],
                              [vi("y", onnx.TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_dq_feeding_an_op_read_by_a_subgraph_does_not_abort(tmp_path, backend):
    """Found by scripts/fuzz_nightly.py: with --backend onnxruntime the conv output's DQ feeds a
    MaxPool whose output an If branch reads; onnxruntime 1.31 aborts (SIGABRT, a C++ assertion
    in its Q/DQ optimizer) when it loads such a graph with optimizations on: in onnxq's own
    validation, and in every user's session.  Run in a subprocess: an abort kills the process."""
    model = tmp_path / "if_pool.onnx"
    onnx.save(if_reads_pooled_conv(), str(model))
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(random_batches_for(if_reads_pooled_conv(), 3)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    out = tmp_path / "q.onnx"
    tmpdir = tmp_path / "tmp"  # an abort skips onnxq's temp-dir cleanup: keep /tmp clean
    tmpdir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "onnxq.cli", "quantize", str(model), "-o", str(out), "--calib",
         str(calib), "--backend", backend, "-q"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "TMPDIR": str(tmpdir)})
    assert proc.returncode in (0, 2), f"exit {proc.returncode}: {proc.stderr[-500:]}"
    if proc.returncode == 0:  # the written model must load with optimizations on (a child too)
        probe = ("import onnxruntime as ort, sys; ort.InferenceSession(sys.argv[1], "
                 "providers=['CPUExecutionProvider'])")
        loaded = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True,
                                text=True, timeout=120, check=False)
        assert loaded.returncode == 0, f"exit {loaded.returncode}: {loaded.stderr[-300:]}"
        assert Path(out).is_file()


def random_batches_for(model: onnx.ModelProto, n: int) -> list[dict[str, np.ndarray]]:
    from tests.fuzzgraphs import random_batches

    return random_batches(model, n, 0)


def softmax_over_one_value() -> onnx.ModelProto:
    """MatMul 16->1 -> Relu -> Softmax over that axis of size 1 (constant 1) -> MatMul 1->32 ->
    Relu -> Sigmoid: between two quantized ops the Softmax gets Q/DQ on both sides."""
    vi = helper.make_tensor_value_info
    r = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["ar"], name="relu1"),
             helper.make_node("Softmax", ["ar"], ["s"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["s", "w2"], ["b"], name="mm2"),
             helper.make_node("Relu", ["b"], ["r"], name="relu2"),
             helper.make_node("Sigmoid", ["r"], ["y"], name="sigmoid")]
    inits = [numpy_helper.from_array(r.standard_normal((16, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(r.standard_normal((1, 32)).astype(np.float32), "w2")]
    graph = helper.make_graph(nodes, "softmax1", [vi("x", onnx.TensorProto.FLOAT, [1, 16])],
                              [vi("y", onnx.TensorProto.FLOAT, [1, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_over_a_single_value_between_quantized_ops(backend):
    """Found by scripts/fuzz_nightly.py: onnxruntime fuses DQ -> Softmax -> Q into
    com.microsoft QLinearSoftmax, which (onnxruntime 1.31) returns 0 instead of 1 for a softmax
    over an axis of size 1; the onnxruntime-backend model is silently wrong (relative error
    0.26 here, 1.0 when the MatMul output was a graph output)."""
    from tests.fuzzgraphs import FuzzCase

    quantize_property(FuzzCase(softmax_over_one_value(), seed=5), backend)
