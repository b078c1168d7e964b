"""Sign facts read from the ops that produce a tensor: whether it is certainly never below 0,
and a Clip's constant bounds."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np
import onnx

from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.node_values import node_attrs


class SignSource(Protocol):
    """What the sign facts read of a graph index (:class:`onnxq.ir.graph.Graph`)."""

    def const_value(self, name: str) -> np.ndarray | None: ...

    def walk_up(
        self, start: Iterable[str], step: Callable[[str, onnx.NodeProto | None], Iterable[str]]
    ) -> None: ...


# ops whose output is >= 0 whatever their input (NaN aside)
NONNEGATIVE_OPS = frozenset({"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Softplus", "Abs", "Exp"})
# ops whose output is >= 0 when their first input is (they move or pick values, or take
# maxima or means of them)
SIGN_KEEPING_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Gather",
        "MaxPool",
        "AveragePool",
        "GlobalMaxPool",
        "GlobalAveragePool",
        "DepthToSpace",
        "SpaceToDepth",
        "Tile",
        "Expand",
    }
)


def nonnegative(graph: SignSource, name: str) -> bool:
    """True when the ops that produce ``name`` guarantee it is never below 0 (Relu, Sigmoid,
    Clip with a constant min >= 0, ... and shape ops and max/average pools over such a tensor).
    False whenever that is not certain."""
    unsure: list[str] = []

    def step(tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if node is None or node.domain not in DEFAULT_DOMAINS:
            unsure.append(tensor)
        elif node.op_type in NONNEGATIVE_OPS:
            pass
        elif node.op_type == "Clip":
            low, _ = clip_bounds(graph, node)
            if not (low is not None and low >= 0.0):
                unsure.append(tensor)
        elif node.op_type in SIGN_KEEPING_OPS or node.op_type == "Concat":
            data = list(node.input if node.op_type == "Concat" else node.input[:1])
            if data and all(data):
                return data
            unsure.append(tensor)
        else:
            unsure.append(tensor)
        return []

    graph.walk_up([name], step)
    return not unsure


def clip_bounds(graph: SignSource, node: onnx.NodeProto) -> tuple[float | None, float | None]:
    """A Clip's constant (min, max); None where it has none (or it is not constant)."""
    attrs = node_attrs(node)
    if "min" in attrs or "max" in attrs:  # opset < 11: attributes
        return (
            float(attrs["min"]) if "min" in attrs else None,
            float(attrs["max"]) if "max" in attrs else None,
        )
    bounds: list[float | None] = []
    for i in (1, 2):  # opset >= 11: optional inputs
        name = node.input[i] if len(node.input) > i else ""
        value = graph.const_value(name) if name else None
        bounds.append(float(value.reshape(())) if value is not None and value.size == 1 else None)
    return bounds[0], bounds[1]
