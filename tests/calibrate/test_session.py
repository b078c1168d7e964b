"""Calibration sessions: the exposed outputs, onnxruntime's failures as onnxq errors (whose
fault), the optimizer fallback, output buffers that give the plain run's values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq import ir
from onnxq.calibrate.engine import calibrate
from onnxq.calibrate.session import OutputBuffers, exposing, make_session
from onnxq.data.sources import model_inputs
from onnxq.errors import InternalError, UnsupportedModelError
from tests import graphs
from tests.calibrate.test_engine import prepared


def _aliasing_model() -> onnx.ModelProto:
    """Outputs: a computed tensor, the graph input itself, an Identity of it, and the count
    of positive values' positions (NonZero: its shape depends on the data)."""
    h, T = onnx.helper, onnx.TensorProto
    nodes = [
        h.make_node("Identity", ["x"], ["xi"]),
        h.make_node("Relu", ["xi"], ["r"]),
        h.make_node("Neg", ["r"], ["y"]),
        h.make_node("NonZero", ["r"], ["nz"]),
    ]
    outputs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "x", "xi")]
    outputs.append(h.make_tensor_value_info("nz", T.INT64, None))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["n", 3])], outputs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("with_nonzero", [False, True])
def test_output_buffers_give_the_plain_runs_values(with_nonzero):
    model = _aliasing_model()
    names = ["y", "x", "xi"] + (["nz"] if with_nonzero else [])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    buffers = OutputBuffers(session, names)
    r = np.random.default_rng(0)
    shapes = [(2, 3), (2, 3), (2, 3), (5, 3), (2, 3), (2, 3)]  # one batch of another shape
    previous: list[np.ndarray] = []
    for index, shape in enumerate(shapes):
        x = r.standard_normal(shape).astype(np.float32)
        got = buffers.run({"x": x}, index)
        want = session.run(names, {"x": x})
        for name, g, w in zip(names, got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"batch {index}, {name}")
        assert all(g is not p for g in got for p in previous)  # the last batch's are intact
        # nothing aliases the input, which the caller drops before the statistics are taken
        assert not any(np.shares_memory(g, x) for g in got)
        previous = got
    if with_nonzero:  # NonZero's shape changes with the data: bound buffers were given up
        assert not buffers._bound
    else:  # the buffers were used, but the graph input comes back as onnxruntime's own value
        assert buffers._bound
        assert got[0] is buffers._sets[1][0] and got[1] is not buffers._sets[1][1]


def test_exposing_shows_exactly_the_observed_tensors_and_restores_the_outputs():
    model, _ = prepared(graphs.residual_add())
    before = ir.serialize(model)
    with exposing(model, ir.Graph(model), ["skip", "conv2_out"]) as aug:
        assert [o.name for o in aug.graph.output] == ["skip", "conv2_out"]
    assert ir.serialize(model) == before  # the original keeps its outputs
    with pytest.raises(RuntimeError), exposing(model, ir.Graph(model), ["skip"]):
        raise RuntimeError("interrupted")
    assert ir.serialize(model) == before  # ... even when the block fails


def test_make_session_wraps_onnxruntime_failures():
    model = graphs.conv_relu()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="onnxruntime cannot load the model"):
        make_session(model)


def test_a_failure_on_the_calibration_copy_blames_onnxq_only_when_the_model_itself_runs(
    monkeypatch,
):
    import onnxq.calibrate.observation

    model, _ = prepared(graphs.conv_relu())
    inputs = model_inputs(ir.Graph(model))
    batches = graphs.random_batches(model, 2)

    def refused(*_args, **_kwargs):
        raise UnsupportedModelError("onnxruntime cannot load the model: Failed to find node")

    monkeypatch.setattr(onnxq.calibrate.observation, "peaks_session", refused)
    with pytest.raises(InternalError, match="calibration copy of the model") as caught:
        calibrate(model, {"x": True}, batches, inputs, progress=False)
    assert "this is a bug in onnxq" in str(caught.value)
    # a model onnxruntime cannot run either way: the model's own error
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="cannot load the model"):
        calibrate(broken, {"x": True}, batches, inputs, progress=False)


def test_a_batch_the_model_fails_on_is_the_models_error_not_the_datas():
    # the data matches the declared input [N, 6]; the model's fixed Reshape cannot take it
    nodes = [
        onnx.helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        onnx.helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    shape = graphs.init("shape", np.array([4, 4], np.int64))
    model = graphs.model(
        nodes, [graphs.tensor("x", ["N", 6])], [graphs.tensor("y", [4, 4])], [shape]
    )
    model, inputs = prepared(model)
    batches = [{"x": np.ones((1, 6), np.float32)}] * 2
    with pytest.raises(UnsupportedModelError, match="batch 0: onnxruntime failed on it") as caught:
        calibrate(model, {"r": True}, batches, inputs, progress=False)
    assert "matches the model's declared inputs" in str(caught.value)
    assert caught.value.onnxruntime_failed


def test_a_session_that_onnxruntimes_layout_optimizer_breaks_falls_back(capsys):
    # onnxruntime 1.31 at ORT_ENABLE_ALL drops a grouped Conv's output that is a graph output
    # and feeds Add(conv, conv) ("Failed to find node output"); calibration exposes exactly
    # such tensors (timm's fastvit_t8 failed with --backend tensorrt)
    from onnx import helper

    from tests import graphs

    r = graphs.rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=32, kernel_shape=[1, 1]),
        helper.make_node(
            "Conv", ["x", "w2", "b2"], ["c2"], group=32, kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Add", ["c1", "c2"], ["y"]),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("x", ["n", 32, 7, 7])],
        [graphs.tensor("y", ["n", 64, 7, 7]), graphs.tensor("c1", ["n", 64, 7, 7])],
        [
            graphs.init("w1", graphs.weight(r, 64, 1, 1, 1)),
            graphs.init("b1", graphs.weight(r, 64)),
            graphs.init("w2", graphs.weight(r, 64, 1, 3, 3)),
            graphs.init("b2", graphs.weight(r, 64)),
        ],
    )
    session = make_session(model)
    x = graphs.rng(1).standard_normal((2, 32, 7, 7)).astype(np.float32)
    y, c1 = session.run(None, {"x": x})
    assert y.shape == c1.shape == (2, 64, 7, 7)
    assert capsys.readouterr().out == ""  # no "EP Error ... retrying" banner
