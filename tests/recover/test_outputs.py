"""The output error sequential correction judges by, and sessions pruned to one tensor."""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import model_inputs
from onnxq.recover.outputs import OutputDrift, pruned_session, run_session, without_padding
from tests.recover.builders import conv_chain, image_batches


def test_the_float_model_has_no_error_and_a_scaled_output_has_the_expected_one():
    m = ir.infer_shapes(conv_chain())
    data = image_batches(m, n=4)
    judge = OutputDrift(m, data, model_inputs(ir.Graph(m)), None, 2**30)
    assert judge(m) == 0.0
    scaled = onnx.ModelProto()
    scaled.CopyFrom(m)
    graph = ir.Graph(scaled)
    w3 = graph.const_value("w3")
    assert w3 is not None
    graph.set_initializer("w3", w3 * 1.1)  # conv3 has no bias: the output is 1.1x
    np.testing.assert_allclose(judge(scaled), 0.01, rtol=1e-4)


def test_a_small_memory_budget_keeps_fewer_batches_but_at_least_one():
    m = ir.infer_shapes(conv_chain())
    data = image_batches(m, n=4)
    inputs = model_inputs(ir.Graph(m))
    assert len(OutputDrift(m, data, inputs, None, 2**30)._batches) == 4
    assert len(OutputDrift(m, data, inputs, None, 1)._batches) == 1
    assert len(OutputDrift(m, data, inputs, 2, 2**30)._batches) == 2
    odd = OutputDrift(m, data, inputs, None, 2**30, every=(2, 1))._batches
    assert len(odd) == 2
    assert all(np.array_equal(b["x"], data[i]["x"]) for b, i in zip(odd, (1, 3), strict=True))


def test_a_pruned_session_computes_the_tensor_and_leaves_the_model_as_it_was():
    m = ir.infer_shapes(conv_chain())
    before = m.SerializeToString()
    batch = image_batches(m, n=1)[0]
    session = pruned_session(m, "c1", "float")
    assert [o.name for o in session.get_outputs()] == ["c1"]
    assert {n.name for n in m.graph.node} >= {"conv3"} and m.SerializeToString() == before
    (c1,) = run_session(session, "c1", batch, 0)
    (y,) = run_session(pruned_session(m, None, "float"), None, batch, 0)
    assert c1.shape == (1, 16, 12, 12) and y.shape == (1, 16, 12, 12)
    assert c1.dtype == np.float64


def _masked_model(padded_value: float) -> onnx.ModelProto:
    """``y = x @ w + padded_value * (1 - mask)``: ``padded_value`` moves only the padded
    positions of the [batch, sequence, hidden] output."""
    from tests.graphs import init, model, tensor

    r = np.random.default_rng(0)
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w"], ["xw"]),
        onnx.helper.make_node("Cast", ["attention_mask"], ["m"], to=onnx.TensorProto.FLOAT),
        onnx.helper.make_node("Sub", ["one", "m"], ["pad"]),
        onnx.helper.make_node("Unsqueeze", ["pad", "axis"], ["pad3"]),
        onnx.helper.make_node("Mul", ["pad3", "value"], ["shift"]),
        onnx.helper.make_node("Add", ["xw", "shift"], ["y"]),
    ]
    inits = [
        init("w", r.standard_normal((8, 8)).astype(np.float32)),
        init("one", np.array(1.0, np.float32)),
        init("axis", np.array([2], np.int64)),
        init("value", np.array(padded_value, np.float32)),
    ]
    inputs = [tensor("x", [2, 5, 8]), tensor("attention_mask", [2, 5], onnx.TensorProto.INT64)]
    return ir.infer_shapes(model(nodes, inputs, [tensor("y", [2, 5, 8])], inits))


def test_padded_positions_are_not_counted_as_drift():
    reference = _masked_model(0.0)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    data = [{"x": x, "attention_mask": mask}]
    judge = OutputDrift(reference, data, model_inputs(ir.Graph(reference)), None, 2**30)
    shifted = _masked_model(5.0)
    (want,) = run_session(pruned_session(reference, None, "float"), None, data[0], 0)
    (got,) = run_session(pruned_session(shifted, None, "float"), None, data[0], 0)
    assert np.abs(got - want)[0, 3:].min() > 4.99  # the padded positions differ ...
    assert judge(shifted) == 0.0  # ... and do not count
    assert judge(_masked_model(0.0)) == 0.0
    np.testing.assert_array_equal(
        without_padding(np.ones((2, 5, 3)), np.zeros((2, 5, 3)), mask == 1)[0].sum(axis=2),
        3 * mask,
    )
