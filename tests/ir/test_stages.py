"""Stages: running a model cut at the live tensors gives every layer input exactly."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

from onnxq import ir
from onnxq.ir.stages import last_reader, plan_stages, stage_model
from tests.weightonly import models


def _full_values(model, names, feed):
    aug = type(model)()
    aug.CopyFrom(model)
    del aug.graph.output[:]
    aug.graph.output.extend(helper.make_tensor_value_info(n, 0, None) for n in names)
    for vi in aug.graph.output:
        vi.type.tensor_type.elem_type = 1
    return dict(
        zip(names, ort.InferenceSession(aug.SerializeToString()).run(names, feed), strict=True)
    )


def test_each_node_runs_in_one_stage_and_targets_come_out_in_order():
    m = models.decoder()
    targets = [["x1"], ["ffn_in"], ["x2"]]
    stages = plan_stages(m, targets)
    owned = [i for s in stages for i in s.nodes]
    assert len(owned) == len(set(owned))
    assert [s.targets for s in stages] == [("x1",), ("ffn_in",), ("x2",)]
    # the last MatMul (the head) is needed by no target: no stage runs it
    head = next(i for i, n in enumerate(m.graph.node) if n.name == "lm_head_proj")
    assert head not in owned
    # h0 (the residual) lives from the first stage to the third
    assert "h0" in stages[0].outputs and "h0" in stages[2].inputs
    assert last_reader(stages)["h0"] == 2


def test_stages_run_one_after_another_reproduce_the_whole_model():
    m = ir.infer_shapes(models.decoder())
    feed = models.token_batches(1)[0]
    targets = [["x1"], ["ffn_in"], ["x2"]]
    want = _full_values(m, ["x1", "ffn_in", "x2"], feed)
    store = dict(feed)
    for stage in plan_stages(m, targets):
        types = {x: helper.np_dtype_to_tensor_dtype(store[x].dtype) for x in stage.inputs}
        sub = stage_model(m, stage, types)
        values = ort.InferenceSession(sub.SerializeToString()).run(
            list(stage.outputs), {x: store[x] for x in stage.inputs}
        )
        store.update(zip(stage.outputs, values, strict=True))
        for t in stage.targets:
            np.testing.assert_allclose(store[t], want[t], rtol=1e-6, atol=1e-6)


def test_replaced_weights_go_into_the_stage_model():
    m = models.decoder()
    stage = plan_stages(m, [["ffn_in"]])[0]
    zero = np.zeros((64, 128), np.float32)
    sub = stage_model(m, stage, {"input_ids": 7}, {"w_up": zero})
    feed = models.token_batches(1)[0]
    out = ort.InferenceSession(sub.SerializeToString()).run(["ffn_in"], feed)[0]
    assert np.all(out == 0)  # gate * up with up = 0


def test_a_target_that_is_a_model_input_gives_an_empty_stage():
    m = models.linear()
    stage = plan_stages(m, [["x"]])[0]
    assert stage.nodes == () and stage.inputs == ("x",)
