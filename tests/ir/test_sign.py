"""onnxq.ir.sign: which tensors are certainly never below 0, and a Clip's constant bounds."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxq import ir
from onnxq.ir.sign import clip_bounds, nonnegative
from tests import graphs


def _chain(*ops: tuple[str, dict]) -> ir.Graph:
    """x[1, 4, 6, 6] -> op -> op ... (each op reads the previous output; Clip bounds and
    Concat's second input come from the op's dict)."""
    nodes, inits, prev = [], [], "x"
    for i, (op, kw) in enumerate(ops):
        inputs, attrs = [prev], dict(kw)
        if op == "Clip":
            for k in ("lo", "hi"):
                inits.append(graphs.init(f"{k}{i}", np.array(attrs.pop(k), np.float32)))
                inputs.append(f"{k}{i}")
        if op == "Concat":
            inputs.append(attrs.pop("other"))
        nodes.append(helper.make_node(op, inputs, [f"t{i}"], name=f"n{i}", **attrs))
        prev = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [graphs.tensor("x", [1, 4, 6, 6])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", graphs.OPSET)])
    return ir.Graph(model)


@pytest.mark.parametrize(
    "ops, expected",
    [
        ([("Relu", {})], True),
        ([("Sigmoid", {}), ("MaxPool", {"kernel_shape": [2, 2]}), ("Flatten", {})], True),
        ([("Clip", {"lo": 0.0, "hi": 6.0}), ("GlobalAveragePool", {})], True),
        ([("Clip", {"lo": -1.0, "hi": 1.0})], False),
        ([("Tanh", {})], False),
        ([("Relu", {}), ("Neg", {})], False),
        ([("Relu", {}), ("Concat", {"axis": 1, "other": "t0"})], True),
        ([("Relu", {}), ("Concat", {"axis": 1, "other": "x"})], False),  # a graph input: unknown
    ],
)
def test_nonnegative_follows_producers_that_bound_a_tensor_below_by_zero(ops, expected):
    graph = _chain(*ops)
    assert graph.nonnegative(f"t{len(ops) - 1}") is expected
    assert graph.nonnegative("x") is False


def test_clip_bounds_read_inputs_or_old_attributes():
    graph = _chain(("Clip", {"lo": -1.0, "hi": 6.0}))
    assert clip_bounds(graph, graph.producer["t0"]) == (-1.0, 6.0)
    old = helper.make_node("Clip", ["x"], ["y"], min=0.0)
    assert clip_bounds(graph, old) == (0.0, None)
    assert nonnegative(graph, "t0") is False
