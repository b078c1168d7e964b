"""The output error sequential correction judges by, and sessions pruned to one tensor."""

from __future__ import annotations

import numpy as np
import onnx

from onnxq import ir
from onnxq.inputs import model_inputs
from onnxq.recover.outputs import OutputError, pruned_session, run_session
from tests.recover.builders import conv_chain, image_batches


def test_the_float_model_has_no_error_and_a_scaled_output_has_the_expected_one():
    m = ir.infer_shapes(conv_chain())
    data = image_batches(m, n=4)
    judge = OutputError(m, data, model_inputs(ir.Graph(m)), None, 2**30)
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
    assert len(OutputError(m, data, inputs, None, 2**30)._batches) == 4
    assert len(OutputError(m, data, inputs, None, 1)._batches) == 1
    assert len(OutputError(m, data, inputs, 2, 2**30)._batches) == 2
    odd = OutputError(m, data, inputs, None, 2**30, every=(2, 1))._batches
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
