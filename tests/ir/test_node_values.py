"""onnxq.ir.node_values: a Constant's value, attributes as Python values, subgraph op types."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxq.ir.node_values import constant_node_value, has_subgraph, inner_op_types, node_attrs


def test_constant_node_value_reads_each_value_attribute():
    assert constant_node_value(helper.make_node("Constant", [], ["c"], value_float=2.0)) == 2.0
    ints = constant_node_value(helper.make_node("Constant", [], ["c"], value_ints=[1, 2]))
    assert ints is not None and ints.dtype == np.int64 and ints.tolist() == [1, 2]
    assert constant_node_value(helper.make_node("Constant", [], ["c"])) is None


def test_attributes_and_subgraph_op_types():
    body = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["b"])],
        "body",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
    )
    node = helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)
    assert has_subgraph(node) and inner_op_types(node) == {"Relu"}
    assert node_attrs(node) == {}
    conv = helper.make_node("Conv", ["x", "w"], ["y"], group=2)
    assert node_attrs(conv) == {"group": 2} and not has_subgraph(conv)
