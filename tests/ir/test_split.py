"""A model cut after one tensor: the part after it, fed what the part before computes, gives
the model's outputs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxq import ir
from onnxq.calibrate.session import make_session
from onnxq.ir.split import cut_after
from tests.graphs import init, model, random_inputs, residual_add, rng, tensor, weight


def _run(m: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str] | None = None):
    return make_session(m, optimize=False).run(names, feeds)


def test_the_suffix_fed_the_boundary_gives_the_models_output():
    m = ir.infer_shapes(residual_add())
    graph = ir.Graph(m)
    cut = cut_after(m, "conv2_out", graph.value_info)
    # the skip connection crosses the cut: it is an input of the suffix with conv2_out
    assert set(cut.boundary) == {"conv2_out", "skip"}
    assert cut.outputs == ("y",)
    assert [n.name for n in cut.suffix.graph.node] == ["add"]
    feeds = random_inputs(m)
    whole = _run(m, feeds)[0]
    with ir.with_outputs(m, [graph.value_info(b) for b in cut.boundary]) as view:
        inside = dict(zip(cut.boundary, _run(view, feeds), strict=True))
    np.testing.assert_allclose(_run(cut.suffix, inside)[0], whole, rtol=1e-6)
    assert len(m.graph.node) == 4  # not edited


def test_nodes_on_constants_stay_in_the_suffix_and_earlier_outputs_are_left_out():
    r = rng(0)
    nodes = [
        helper.make_node("Relu", ["x"], ["early"], name="relu"),
        helper.make_node("Neg", ["w"], ["w_neg"], name="neg_w"),  # reads constants only
        helper.make_node("Mul", ["early", "w_neg"], ["late"], name="mul"),
    ]
    m = model(
        nodes, [tensor("x", [2, 3])], [tensor("early", [2, 3]), tensor("late", [2, 3])],
        [init("w", weight(r, 2, 3))],
    )  # fmt: skip
    cut = cut_after(ir.infer_shapes(m), "early", ir.Graph(m).value_info)
    assert cut.boundary == ("early",)
    assert cut.outputs == ("late",)
    assert [n.name for n in cut.suffix.graph.node] == ["neg_w", "mul"]
    x = np.abs(weight(r, 2, 3)) + 0.5
    np.testing.assert_allclose(_run(cut.suffix, {"early": x})[0], _run(m, {"x": x})[1], rtol=1e-6)
