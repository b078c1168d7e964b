"""Quantizing ops inside If, Loop and Scan bodies, end to end: which ops get Q/DQ (and where),
what stays float and why, statistics over every run of a body, and numerics against the float
model in onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq import cli, ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from tests import control_flow_graphs as cf
from tests.profiles import ONNXRUNTIME_NO_COST

QDQ = ("QuantizeLinear", "DequantizeLinear")


@pytest.fixture
def no_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The onnxruntime profile without its cost rules (the tiny ops here would stay float)."""
    monkeypatch.setitem(PROFILES, "onnxruntime", ONNXRUNTIME_NO_COST)


def session(model: onnx.ModelProto, optimize: bool) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def qdq_per_graph(model: onnx.ModelProto) -> dict[str, int]:
    """Q/DQ nodes per graph: "" for the top level, else ``Body.key``."""
    out = {"": sum(n.op_type in QDQ for n in model.graph.node)}
    for body in ir.all_bodies(model.graph):
        out[body.key] = sum(n.op_type in QDQ for n in body.graph.node)
    return out


def agreement(float_model, result, batches, backend: str) -> float:
    """The worst cosine between the float and the quantized outputs over ``batches`` (the
    quantized model run as its backend is validated: fused for onnxruntime, unfused else)."""
    fused = backend == "onnxruntime"
    f, q = session(float_model, fused), session(result.model, fused)
    worst = 1.0
    for batch in batches:
        for a, b in zip(f.run(None, batch), q.run(None, batch), strict=True):
            a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
            worst = min(worst, float(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64)))
    return worst


def valid(result: onnxq.QuantizedModel, backend: str) -> None:
    onnx.checker.check_model(result.model, full_check=True)
    assert check(result.model, PROFILES[backend]) == []


def loads_with_optimizations(model: onnx.ModelProto, tmp_path: Path) -> None:
    """onnxruntime's default session loads and runs ``model`` (in a child process: its Q/DQ
    optimizer has aborted the process on Q/DQ next to tensors that bodies read)."""
    path = tmp_path / "q.onnx"
    onnx.save(model, str(path))
    probe = (
        "import onnxruntime as ort, sys; "
        "ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(path)], check=False, timeout=120)
    assert done.returncode == 0


def float_ops(result: onnxq.QuantizedModel) -> dict[str, str]:
    return {d.node: d.reason for d in result.report.float_ops}


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_both_branches_of_an_if_are_quantized(backend, no_cost, tmp_path):
    model = cf.if_convs()
    batches = cf.batches(model, 6, use_then=lambda k: k % 2 == 0)
    result = onnxq.quantize(model, batches, backend=backend, progress=False)
    valid(result, backend)
    quantized = {d.node for d in result.report.quantized_ops}
    counts = qdq_per_graph(result.model)
    assert counts[""] == 0  # every Q/DQ sits in the branch that reads it
    if backend == "tensorrt":
        # Q/DQ on x (read from the enclosing graph) and a weight DQ in each branch
        assert quantized == {"then_conv", "else_conv"}
        assert counts == {"": 0, "if/else_branch": 3, "if/then_branch": 3}
    else:
        # the then conv's output is its branch's output (never quantized), onnxruntime has no
        # integer Conv with a float output; the else conv's output feeds a Mul: Q/DQ on x and
        # on that output, the weight's and the int32 bias's DQ
        assert quantized == {"else_conv"}
        assert "graph output" in float_ops(result)["then_conv"]
        assert counts == {"": 0, "if/else_branch": 6, "if/then_branch": 0}
    assert agreement(model, result, batches, backend) > 0.999
    loads_with_optimizations(result.model, tmp_path)


def test_a_branch_never_taken_stays_float_with_the_reason():
    model = cf.if_convs()
    result = onnxq.quantize(model, cf.batches(model, 4, use_then=True), progress=False)
    why = "branch never taken on the calibration data (else_branch of If 'if')"
    # its conv reads x, which the data does show: it stays float all the same
    assert float_ops(result)["else_conv"] == why
    assert float_ops(result)["else_mul"] == why
    assert {d.node for d in result.report.quantized_ops} == {"then_conv"}
    assert qdq_per_graph(result.model) == {"": 0, "if/else_branch": 0, "if/then_branch": 3}
    # taken with other data, the float branch computes exactly what it did
    other = cf.batches(model, 2, use_then=False)
    want, got = session(model, False), session(result.model, False)
    for batch in other:
        np.testing.assert_array_equal(got.run(None, batch)[0], want.run(None, batch)[0])


def test_nested_branches_are_quantized_where_the_data_runs_them():
    model = cf.nested_if()
    # (outer, inner): (True, True) runs a, (False, *) runs c; b (inner else) never runs
    batches = cf.batches(model, 6, outer=lambda k: k % 2 == 0, inner=True)
    result = onnxq.quantize(model, batches, progress=False)
    valid(result, "tensorrt")
    assert {d.node for d in result.report.quantized_ops} == {"a_conv", "c_conv"}
    assert float_ops(result)["b_conv"] == (
        "branch never taken on the calibration data (else_branch of If 'inner_if')"
    )
    assert qdq_per_graph(result.model) == {
        "": 0,
        "outer_if/else_branch": 3,
        "outer_if/then_branch": 0,
        "inner_if/else_branch": 0,
        "inner_if/then_branch": 3,
    }
    assert agreement(model, result, batches, "tensorrt") > 0.999


def activation_scale(result: onnxq.QuantizedModel, tensor: str) -> float:
    (placed,) = [p for p in result.report.placed if p.tensor == tensor]
    return float(np.asarray(placed.qparams.scale).ravel()[0])


def test_loop_statistics_cover_every_iteration():
    model = cf.loop_matmul()
    batches = cf.batches(model, 3, steps=lambda k: 4 + k)
    result = onnxq.quantize(model, batches, method="minmax", progress=False)
    valid(result, "tensorrt")
    assert {d.node for d in result.report.quantized_ops} == {"loop_matmul"}
    assert qdq_per_graph(result.model) == {"": 0, "loop/body": 3}
    # the MatMul reads h0 + i at iteration i: the range is the widest over all of them
    every = max(float(np.abs(b["h0"] + i).max()) for b in batches for i in range(int(b["steps"])))
    first = max(float(np.abs(b["h0"]).max()) for b in batches)
    assert every > 2 * first
    assert activation_scale(result, "h") == pytest.approx(every / 127, rel=1e-6)
    assert agreement(model, result, batches, "tensorrt") > 0.999


def test_scan_statistics_cover_every_step():
    model = cf.scan_matmul(steps=6)
    batches = cf.batches(model, 3)
    result = onnxq.quantize(model, batches, method="minmax", progress=False)
    valid(result, "tensorrt")
    assert qdq_per_graph(result.model) == {"": 0, "scan/body": 3}
    body = next(a.g for a in model.graph.node[0].attribute if a.name == "body")
    w = onnx.numpy_helper.to_array(
        next(n for n in body.node if n.op_type == "Constant").attribute[0].t
    )
    peak = 0.0
    for batch in batches:
        s = batch["s0"]
        for t in range(6):
            z = s + batch["xs"][t]
            peak, s = max(peak, float(np.abs(z).max())), np.tanh(z @ w)
    assert activation_scale(result, "z") == pytest.approx(peak / 127, rel=1e-6)
    assert agreement(model, result, batches, "tensorrt") > 0.99


def test_an_if_inside_a_loop_is_calibrated_on_the_iterations_it_ran():
    model = cf.if_in_loop()
    batches = cf.batches(model, 3, steps=6)
    result = onnxq.quantize(model, batches, method="minmax", progress=False)
    valid(result, "tensorrt")
    assert {d.node for d in result.report.quantized_ops} == {"odd_matmul"}
    # the branch reads h from the loop body: h0 + i on the odd iterations (1, 3, 5) only
    odd = max(float(np.abs(b["h0"] + i).max()) for b in batches for i in (1, 3, 5))
    assert activation_scale(result, "h") == pytest.approx(odd / 127, rel=1e-6)


def test_a_value_a_scan_cannot_stack_stays_float_with_the_reason():
    model = cf.if_in_scan()
    result = onnxq.quantize(model, cf.batches(model, 3), progress=False)
    valid(result, "tensorrt")
    assert "inner_matmul" in {d.node for d in result.report.quantized_ops}  # reads the slice
    why = float_ops(result)["branch_matmul"]
    assert why.startswith("tensor 'u' cannot be calibrated: inside the body of Scan 'scan'")


def test_a_calibration_cache_keeps_the_branches_that_never_ran(tmp_path):
    model = cf.if_convs()
    cache = tmp_path / "calib.json"
    first = onnxq.quantize(
        model, cf.batches(model, 4, use_then=True), progress=False, save_calibration=cache
    )
    again = onnxq.quantize(model, None, progress=False, load_calibration=cache)
    assert float_ops(again) == float_ops(first)
    assert ir.serialize(again.model) == ir.serialize(first.model)


def test_explain_lists_the_ops_inside_bodies(capsys, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(cf.if_convs(), str(path))
    assert cli.main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "then_conv" in out and "else_conv" in out and "is control flow" in out
    assert "2 of 5 ops quantized" in out


CHILD = """
import json, sys
import onnxq
from onnxq.backends.profile import PROFILES
from tests.profiles import ONNXRUNTIME_NO_COST
PROFILES["onnxruntime"] = ONNXRUNTIME_NO_COST
model, calib, out, backend = sys.argv[1:]
result = onnxq.quantize(model, calib, backend=backend, progress=False)
result.save(out)
print(json.dumps({d.node: d.reason for d in result.report.float_ops}))
"""


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_no_dequantize_reaches_a_tensor_a_nested_body_reads(backend, tmp_path):
    """Inside a branch, a Conv -> MaxPool whose output a nested If reads: the rules keep any
    DQ away from it as at the top level (onnxruntime's Q/DQ optimizer aborted the process on
    such a DQ), and the output loads with optimizations on.  Quantized in a child process (an
    abort would kill this one), the onnxruntime profile without its cost rules."""
    model = cf.nested_read_through_maxpool()
    path, calib, out = tmp_path / "m.onnx", tmp_path / "calib", tmp_path / "q.onnx"
    onnx.save(model, str(path))
    calib.mkdir()
    for i, batch in enumerate(cf.batches(model, 4, outer=True, inner=lambda k: k % 2 == 0)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(calib), str(out), backend],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-500:]
    loads_with_optimizations(onnx.load(str(out)), tmp_path)
    reasons = json.loads(done.stdout)
    if backend == "tensorrt":  # input Q/DQ only: nothing next to the pooled tensor
        assert qdq_per_graph(onnx.load(str(out)))["outer_if/then_branch"] == 3
    else:  # its output Q/DQ would put a DQ before the MaxPool: the conv stays float
        assert "control-flow subgraph" in reasons["branch_conv"]


def test_the_same_inputs_give_the_same_bytes_and_check_counts_the_bodies(tmp_path, capsys):
    model = cf.if_in_loop()
    batches = cf.batches(model, 3, steps=6)
    first = onnxq.quantize(model, batches, progress=False)
    second = onnxq.quantize(model, batches, progress=False)
    assert ir.serialize(first.model) == ir.serialize(second.model)
    path = tmp_path / "q.onnx"
    first.save(path)
    assert cli.main(["check", str(path), "--backend", "tensorrt"]) == 0
    assert "0 tensorrt violation(s), 3 Q/DQ nodes" in capsys.readouterr().out


def test_branches_that_reuse_names_get_their_own_qparams():
    model = cf.twin_branch_convs()
    batches = cf.batches(model, 4, c=lambda k: k % 2 == 0)
    result = onnxq.quantize(model, batches, progress=False)
    valid(result, "tensorrt")
    # the second branch's names were made unique: two convs, two weights, one shared input
    assert len(result.report.quantized_ops) == 2
    weights = [p for p in result.report.placed if p.kind == "weight"]
    assert len({p.tensor for p in weights}) == 2
    assert not np.array_equal(weights[0].qparams.scale, weights[1].qparams.scale)
    assert agreement(model, result, batches, "tensorrt") > 0.999
