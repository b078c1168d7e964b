"""The control-flow ops of the fuzz graphs (``tests/fuzzgraphs.py``): If, Loop and Scan whose
bodies hold ops onnxq quantizes (Conv, MatMul), with weights inside the body (``Constant``
nodes) or read from the enclosing graph (initializers), drawn.

* ``If``: condition ``ReduceSum(t) > 0`` on an input or an activation (exposed as an extra bool
  output, so the oracle can tell a branch flip from an error); each branch a Relu, a scale, a
  Sigmoid, or a shape-keeping Conv/MatMul on the activation it reads from the outer scope.
* ``Loop``: 1-3 iterations of ``h <- Tanh(MatMul(h, W))`` over a carried activation, its
  final value and (rank permitting) the per-iteration stack as outputs.
* ``Scan``: over axis 1 of a [1, T, K] activation, ``s <- Tanh(MatMul(s + x_t, W))``, the final
  state and the per-step outputs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from tests.fuzzgraphs import Builder, Tensor

FLOAT = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _body_weight(b: Builder, nodes: list[onnx.NodeProto], value: np.ndarray) -> str:
    """A weight inside a body (a Constant node there) or in the enclosing graph (drawn)."""
    if b.draw(st.booleans()):
        return b.const("outer_w", value)
    name = b.fresh("body_w")
    nodes.append(
        helper.make_node(
            "Constant", [], [name], name=b.fresh("Constant"), value=numpy_helper.from_array(value)
        )
    )
    return name


def _branch(b: Builder, x: Tensor, tag: str) -> tuple[onnx.GraphProto, str]:
    """One If branch reading ``x`` from the enclosing graph, giving a value of its shape."""
    kinds = ["relu", "scale", "sigmoid"]
    if x.rank == 4 or (x.rank >= 2 and x.shape[-1] <= 64):
        kinds += ["weighted", "weighted"]
    kind = b.choice(kinds)
    nodes: list[onnx.NodeProto] = []
    out = b.fresh(f"{tag}_out")
    if kind == "relu":
        nodes.append(helper.make_node("Relu", [x.name], [out], name=b.fresh("Relu")))
    elif kind == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", [x.name], [out], name=b.fresh("Sigmoid")))
    elif kind == "scale":
        half = _body_weight(b, nodes, np.float32(0.5))
        nodes.append(helper.make_node("Mul", [x.name, half], [out], name=b.fresh("Mul")))
    elif x.rank == 4:
        c = x.shape[1]
        w = _body_weight(b, nodes, b.weight((c, c, 3, 3), c * 9, 1.4))
        nodes.append(
            helper.make_node("Conv", [x.name, w], [out], name=b.fresh("Conv"), pads=[1] * 4)
        )
    else:
        k = x.shape[-1]
        w = _body_weight(b, nodes, b.weight((k, k), k, 1.0))
        nodes.append(helper.make_node("MatMul", [x.name, w], [out], name=b.fresh("MatMul")))
    graph = helper.make_graph(nodes, tag, [], [vi(out, FLOAT, list(x.shape))])
    return graph, kind


def op_if(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    on_input = b.draw(st.booleans())
    source = b.draw(st.sampled_from(b.inputs)) if on_input else b.pick()
    assert source is not None
    total, cond = b.fresh("sum"), b.fresh("cond")
    b.node("ReduceSum", [source.name], [total], keepdims=0)
    b.node("Greater", [total, b.const("zero", np.float32(0.0))], [cond])
    then_g, then_kind = _branch(b, x, "then")
    else_g, else_kind = _branch(b, x, "else")
    y = b.fresh("if")
    b.node("If", [cond], [y], then_branch=then_g, else_branch=else_g)
    b.consumed.add(x.name)
    if not on_input:  # the oracle compares this to tell a branch flip from an error
        b.extra_outputs.append(vi(cond, TensorProto.BOOL, []))
    b.add(y, x.shape)
    b.ops.append(f"If(sum({'input' if on_input else 'act'})>0, {then_kind} | {else_kind})")
    return True


def op_loop(b: Builder) -> bool:
    x = b.pick(lambda t: t.rank >= 2 and t.shape[-1] <= 64)
    if x is None:
        return False
    k, steps = x.shape[-1], b.choice([1, 2, 3])
    h, cond_in, it = b.fresh("h"), b.fresh("cond_in"), b.fresh("iteration")
    t, h_next, cond_out, y = b.fresh("t"), b.fresh("h_next"), b.fresh("cond_out"), b.fresh("y")
    nodes = [helper.make_node("Identity", [cond_in], [cond_out], name=b.fresh("Identity"))]
    w = _body_weight(b, nodes, b.weight((k, k), k, 1.4))
    nodes += [
        helper.make_node("MatMul", [h, w], [t], name=b.fresh("MatMul")),
        helper.make_node("Tanh", [t], [h_next], name=b.fresh("Tanh")),
        helper.make_node("Identity", [t], [y], name=b.fresh("Identity")),
    ]
    shape = list(x.shape)
    body = helper.make_graph(
        nodes,
        "loop_body",
        [vi(it, TensorProto.INT64, []), vi(cond_in, TensorProto.BOOL, []), vi(h, FLOAT, shape)],
        [vi(cond_out, TensorProto.BOOL, []), vi(h_next, FLOAT, shape), vi(y, FLOAT, shape)],
    )
    last, stacked = b.fresh("loop_h"), b.fresh("loop_ys")
    trips = b.const("trips", np.int64(steps))
    b.node("Loop", [trips, "", x.name], [last, stacked], body=body)
    b.add(last, x.shape)
    if x.rank < 4:
        b.add(stacked, (steps, *x.shape))
    else:
        b.consumed.add(stacked)  # left unread (a Loop output nobody needs)
    b.ops.append(f"Loop{steps}(tanh(h @ W[{k}]))")
    return True


def op_scan(b: Builder) -> bool:
    x = b.pick(lambda t: t.rank == 3 and t.shape[2] <= 64)
    if x is None:
        return False
    _, steps, k = x.shape
    s, x_t, z, y, s_next = (b.fresh(n) for n in ("s", "x_t", "z", "y", "s_next"))
    nodes = [helper.make_node("Add", [s, x_t], [z], name=b.fresh("Add"))]
    w = _body_weight(b, nodes, b.weight((k, k), k, 1.4 / math.sqrt(2)))
    nodes += [
        helper.make_node("MatMul", [z, w], [y], name=b.fresh("MatMul")),
        helper.make_node("Tanh", [y], [s_next], name=b.fresh("Tanh")),
    ]
    body = helper.make_graph(
        nodes,
        "scan_body",
        [vi(s, FLOAT, [1, k]), vi(x_t, FLOAT, [1, k])],
        [vi(s_next, FLOAT, [1, k]), vi(y, FLOAT, [1, k])],
    )
    start = b.const("s0", np.zeros((1, k), np.float32))
    last, ys = b.fresh("scan_s"), b.fresh("scan_ys")
    b.node(
        "Scan",
        [start, x.name],
        [last, ys],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_output_axes=[1],
    )
    b.add(last, (1, k))
    b.add(ys, (1, steps, k))
    b.ops.append(f"Scan{steps}(tanh((s + x_t) @ W[{k}]))")
    return True
