"""Probes: values inside If/Loop/Scan bodies threaded out to the top-level graph, checked against
the same values computed by hand (numpy) or exposed by the model itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnxq import ir
from tests import control_flow_graphs as cf
from tests import graphs


def probed(model: onnx.ModelProto, tensors: list[str], batch: dict):
    """Run ``model`` with ``tensors`` probed; returns the plan and the named outputs."""
    with ir.with_probes(model, tensors) as plan, ir.with_outputs(model, plan.outputs) as aug:
        session = ort.InferenceSession(aug.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in plan.outputs]
    return plan, dict(zip(names, session.run(names, batch), strict=True))


def weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The constant ``name``: an initializer of any graph, or a Constant node's value."""
    for graph in [model.graph, *(b.graph for b in ir.all_bodies(model.graph))]:
        for t in graph.initializer:
            if t.name == name:
                return onnx.numpy_helper.to_array(t)
    node = next(n for n in ir.every_node(model.graph) if n.output[:1] == [name])
    return onnx.numpy_helper.to_array(node.attribute[0].t)


def test_the_model_is_restored_byte_for_byte():
    for model in (cf.if_convs(), cf.nested_if(), cf.loop_matmul(), cf.scan_matmul()):
        before = model.SerializeToString()
        tensors = [o for n in ir.every_node(model.graph) for o in n.output]
        with ir.with_probes(model, tensors) as plan:
            assert plan.outputs and model.SerializeToString() != before
        assert model.SerializeToString() == before


def test_if_branches_give_their_values_and_how_often_they_ran():
    model = ir.infer_shapes(cf.if_convs())
    batch = cf.batches(model, 1, use_then=True)[0]
    plan, outs = probed(model, ["then_conv_out", "else_conv_out"], batch)
    taken = plan.probes["then_conv_out"].values(outs)
    assert [a.shape for a in taken] == [(1, 16, 8, 8)]
    relu_of_it = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, batch)[0]
    np.testing.assert_allclose(np.maximum(taken[0], 0), relu_of_it, rtol=1e-6)
    assert plan.probes["else_conv_out"].values(outs) == []
    assert plan.runs(outs) == {"if/else_branch": 0, "if/then_branch": 1}
    runs = plan.runs(outs)
    assert plan.never_ran("else_conv_out", runs) == (
        "branch never taken on the calibration data (else_branch of If 'if')"
    )
    assert plan.never_ran("then_conv_out", runs) is None


def test_nested_branches_name_the_outermost_branch_that_never_ran():
    model = ir.infer_shapes(cf.nested_if())
    batch = cf.batches(model, 1, outer=False, inner=True)[0]
    plan, outs = probed(model, ["a_out", "c_out"], batch)
    runs = plan.runs(outs)
    assert runs["outer_if/else_branch"] == 1 and runs["outer_if/then_branch"] == 0
    assert runs["inner_if/then_branch"] == 0
    assert "then_branch of If 'outer_if'" in plan.never_ran("a_out", runs)
    assert [a.shape for a in plan.probes["c_out"].values(outs)] == [(1, 16, 8, 8)]


def test_a_loop_gives_every_iteration():
    model = ir.infer_shapes(cf.loop_matmul())
    batch = cf.batches(model, 1, steps=5)[0]
    plan, outs = probed(model, ["h", "step_y"], batch)
    h = plan.probes["h"].values(outs)
    want = [batch["h0"] + i for i in range(5)]
    assert len(h) == 5
    for got, expected in zip(h, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    w = weight(model, "loop.w")
    for got, x in zip(plan.probes["step_y"].values(outs), want, strict=True):
        np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-6)
    assert plan.runs(outs) == {"loop/body": 5}


def test_a_loop_that_never_iterates_says_so():
    model = ir.infer_shapes(cf.loop_matmul())
    plan, outs = probed(model, ["h"], cf.batches(model, 1, steps=0)[0])
    assert plan.probes["h"].values(outs) == []
    assert plan.never_ran("h", plan.runs(outs)) == (
        "body never run on the calibration data (body of Loop 'loop': no iteration)"
    )


def test_an_if_inside_a_loop_gives_the_iterations_it_ran():
    model = ir.infer_shapes(cf.if_in_loop())
    batch = cf.batches(model, 1, steps=6)[0]
    plan, outs = probed(model, ["h", "odd_y"], batch)
    odd = plan.probes["odd_y"].values(outs)
    w = weight(model, "odd.w")
    assert len(odd) == 3  # iterations 1, 3, 5
    for got, i in zip(odd, (1, 3, 5), strict=True):
        np.testing.assert_allclose(got, (batch["h0"] + i) @ w, rtol=1e-5, atol=1e-6)
    assert plan.runs(outs) == {
        "loop/body": 6,
        "step_if/else_branch": 3,
        "step_if/then_branch": 3,
    }


def test_loop_values_whose_shape_changes_every_iteration():
    """A carried tensor that grows by one column per iteration comes back whole each time."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("Concat", ["acc", "x"], ["grown"], axis=1),
            helper.make_node("Relu", ["grown"], ["seen"]),
        ],
        "body",
        [
            graphs.tensor("i", [], TensorProto.INT64),
            graphs.tensor("c", [], TensorProto.BOOL),
            graphs.tensor("acc", [1, None]),
        ],
        [graphs.tensor("c_out", [], TensorProto.BOOL), graphs.tensor("seen", [1, None])],
    )
    model = graphs.model(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)],
        [graphs.tensor("x", [1, 1]), graphs.tensor("n", [], TensorProto.INT64)],
        [graphs.tensor("y", [1, None])],
    )
    batch = {"x": np.array([[2.0]], np.float32), "n": np.array(3, np.int64)}
    plan, outs = probed(ir.infer_shapes(model), ["seen"], batch)
    assert [a.shape for a in plan.probes["seen"].values(outs)] == [(1, 2), (1, 3), (1, 4)]


def test_a_scan_stacks_its_steps():
    model = ir.infer_shapes(cf.scan_matmul(steps=6))
    batch = cf.batches(model, 1)[0]
    plan, outs = probed(model, ["z"], batch)
    (z,) = plan.probes["z"].values(outs)  # the 6 steps, folded into the first axis
    w = weight(model, "scan.w")
    s, want = batch["s0"], []
    for t in range(6):
        want.append(s + batch["xs"][t])
        s = np.tanh(want[-1] @ w)
    np.testing.assert_allclose(z, np.concatenate(want), rtol=1e-5, atol=1e-6)
    assert plan.runs(outs) == {"scan/body": 6}


def test_a_value_under_an_if_inside_a_scan_is_declined_with_the_reason():
    model = ir.infer_shapes(cf.if_in_scan())
    batch = cf.batches(model, 1)[0]
    plan, outs = probed(model, ["u", "x_t"], batch)
    assert "u" not in plan.probes and "inside the body of Scan 'scan'" in plan.declined["u"]
    (x_t,) = plan.probes["x_t"].values(outs)  # the Scan's own slices are fine
    np.testing.assert_array_equal(x_t, batch["xs"].reshape(-1, 32))
    assert "step_if/then_branch" not in plan.runs(outs)  # not countable through the Scan
    assert plan.never_ran("u", {}) is None
