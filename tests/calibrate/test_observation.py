"""Observing the batches: passes over groups give one pass's statistics, the model is left as
it was, tensors inside control-flow bodies are observed over every run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxq import ir
from onnxq.calibrate.engine import calibrate
from tests import graphs
from tests.calibrate.test_engine import batched_conv, prepared


def test_memory_budget_splits_tensors_into_passes_with_the_same_result():
    model, inputs = prepared(graphs.residual_add())
    batches = graphs.random_batches(model, 3)
    tensors = {"x": True, "skip": True, "conv2_out": True}
    one = calibrate(model, tensors, batches, inputs, progress=False)
    split = calibrate(model, tensors, batches, inputs, memory_budget=1, progress=False)
    assert split.batches_seen == one.batches_seen == 3
    for name in tensors:
        assert split.stats[name].count == one.stats[name].count
        np.testing.assert_array_equal(split.stats[name].counts, one.stats[name].counts)


def test_observing_adds_nothing_to_the_model():
    model, inputs = prepared(batched_conv())
    before = ir.serialize(model)
    calibrate(
        model,
        {"conv_out": True, "x": False},
        graphs.random_batches(model, 2),
        inputs,
        progress=False,
    )
    assert ir.serialize(model) == before


def test_tensors_inside_bodies_are_observed_over_every_run_of_their_body():
    from tests import control_flow_graphs as cf

    model, inputs = prepared(cf.if_in_loop())
    batches = cf.batches(model, 3, steps=lambda k: 3 + k)  # 3, 4, 5 iterations
    result = calibrate(
        model, {"h": True, "odd_y": True, "h0": False}, batches, inputs, progress=False
    )
    # h at iteration i is h0 + i; odd_y = MatMul(h, W) on the odd iterations only
    w = onnx.numpy_helper.to_array(
        next(n for n in ir.every_node(model.graph) if n.output[0] == "odd.w").attribute[0].t
    )
    h = [b["h0"] + i for b in batches for i in range(int(b["steps"]))]
    odd = [(b["h0"] + i) @ w for b in batches for i in range(1, int(b["steps"]), 2)]
    for name, values in (("h", h), ("odd_y", odd)):
        stats, flat = result.stats[name], np.concatenate([v.ravel() for v in values])
        assert stats.count == flat.size and stats.counts.sum() == flat.size
        assert stats.min == pytest.approx(float(flat.min()), rel=1e-6)
        assert stats.max == pytest.approx(float(flat.max()), rel=1e-6)
    assert result.body_runs == {  # 1 + 2 + 2 odd iterations of 3 + 4 + 5
        "loop/body": 12,
        "step_if/else_branch": 7,
        "step_if/then_branch": 5,
    }
    assert result.unobservable == {}
