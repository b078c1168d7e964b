"""Plain facts read off one node: a Constant's value, the attributes as Python values, and the
op types hidden in its control-flow bodies."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxq.ir.order import attr_graphs


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, or ``None`` for a sparse one."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain Python values (subgraphs left out)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        out[attr.name] = helper.get_attribute_value(attr)
    return out


def has_subgraph(node: onnx.NodeProto) -> bool:
    """True for If/Loop/Scan and any node with a graph attribute."""
    return any(attr_graphs(a) for a in node.attribute)


def inner_op_types(node: onnx.NodeProto) -> set[str]:
    """The op types inside ``node``'s subgraphs, at any depth (empty for a plain op)."""
    found: set[str] = set()
    for attr in node.attribute:
        for sub in attr_graphs(attr):
            for inner in sub.node:
                found.add(inner.op_type)
                found |= inner_op_types(inner)
    return found
