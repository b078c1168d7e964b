"""Tiny models whose quantizable ops sit inside If, Loop and Scan bodies (float32, opset 17).

Weights come from a seeded RNG, so two calls give the same bytes; names are fixed so that
tests can refer to them.  Every builder passes ``onnx.checker``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.graphs import FLOAT, init, model, rng, tensor, weight

BOOL = TensorProto.BOOL
INT64 = TensorProto.INT64


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    """A Constant node (how exporters put weights into bodies)."""
    return helper.make_node(
        "Constant", [], [name], name=f"{name}_const", value=numpy_helper.from_array(value, name)
    )


def _conv(prefix: str, x: str, w: str, out: str, bias: str = "") -> onnx.NodeProto:
    inputs = [x, w] + ([bias] if bias else [])
    return helper.make_node("Conv", inputs, [out], name=f"{prefix}_conv", pads=[1, 1, 1, 1])


def if_convs(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """``y = If(use_then, then: Relu(Conv(x, tw)), else: Conv(x, ew, eb) * 0.5)``.

    ``x`` is a top-level input both branches read from the outer scope; the then branch's
    weight is a Constant node inside it, the else branch's weight and bias are top-level
    initializers it reads from the outer scope."""
    r = rng(seed)
    shape = [1, channels, 8, 8]
    then_graph = helper.make_graph(
        [
            _const("then.w", weight(r, channels, channels, 3, 3)),
            _conv("then", "x", "then.w", "then_conv_out"),
            helper.make_node("Relu", ["then_conv_out"], ["then_out"], name="then_relu"),
        ],
        "then_branch",
        [],
        [tensor("then_out", shape)],
    )
    else_graph = helper.make_graph(
        [
            _conv("else", "x", "else.w", "else_conv_out", "else.b"),
            _const("else.half", np.float32(0.5)),
            helper.make_node("Mul", ["else_conv_out", "else.half"], ["else_out"], name="else_mul"),
        ],
        "else_branch",
        [],
        [tensor("else_out", shape)],
    )
    return model(
        [
            helper.make_node(
                "If", ["use_then"], ["y"], name="if", then_branch=then_graph, else_branch=else_graph
            )
        ],
        [tensor("x", shape), tensor("use_then", [], BOOL)],
        [tensor("y", shape)],
        [init("else.w", weight(r, channels, channels, 3, 3)), init("else.b", weight(r, channels))],
        name="if_convs",
    )


def nested_if(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """``y = If(outer, then: If(inner, then: Conv a, else: Conv b), else: Conv c)``, each
    branch's Conv reading ``t = Relu(x)`` of the top-level graph."""
    r = rng(seed)
    shape = [1, channels, 8, 8]

    def branch(tag: str) -> onnx.GraphProto:
        return helper.make_graph(
            [
                _const(f"{tag}.w", weight(r, channels, channels, 3, 3)),
                _conv(tag, "t", f"{tag}.w", f"{tag}_out"),
            ],
            f"{tag}_branch",
            [],
            [tensor(f"{tag}_out", shape)],
        )

    inner = helper.make_node(
        "If",
        ["inner"],
        ["inner_y"],
        name="inner_if",
        then_branch=branch("a"),
        else_branch=branch("b"),
    )
    outer_then = helper.make_graph([inner], "outer_then", [], [tensor("inner_y", shape)])
    return model(
        [
            helper.make_node("Relu", ["x"], ["t"], name="relu"),
            helper.make_node(
                "If",
                ["outer"],
                ["y"],
                name="outer_if",
                then_branch=outer_then,
                else_branch=branch("c"),
            ),
        ],
        [tensor("x", shape), tensor("outer", [], BOOL), tensor("inner", [], BOOL)],
        [tensor("y", shape)],
        name="nested_if",
    )


def loop_matmul(width: int = 32, seed: int = 0) -> onnx.ModelProto:
    """A Loop of ``steps`` iterations over a carried ``h`` [1, width]: each iteration outputs
    ``MatMul(h, W)`` (a scan output) and carries ``h + 1``, so the MatMul's input grows by 1
    per iteration and its range over all iterations is wider than any one iteration's."""
    r = rng(seed)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
            helper.make_node("MatMul", ["h", "loop.w"], ["step_y"], name="loop_matmul"),
            _const("loop.one", np.float32(1.0)),
            helper.make_node("Add", ["h", "loop.one"], ["h_next"], name="loop_add"),
        ],
        "loop_body",
        [tensor("iteration", [], INT64), tensor("cond_in", [], BOOL), tensor("h", [1, width])],
        [tensor("cond_out", [], BOOL), tensor("h_next", [1, width]), tensor("step_y", [1, width])],
    )
    return model(
        [helper.make_node("Loop", ["steps", "", "h0"], ["h_last", "ys"], name="loop", body=body)],
        [tensor("h0", [1, width]), tensor("steps", [], INT64)],
        [tensor("h_last", [1, width]), tensor("ys", [None, 1, width])],
        [init("loop.w", weight(r, width, width, scale=0.2))],
        name="loop_matmul",
    )


def scan_matmul(width: int = 32, steps: int = 6, seed: int = 0) -> onnx.ModelProto:
    """A Scan over ``xs`` [steps, 1, width] with a carried state ``s``: each step computes
    ``z = s + x_t`` and ``y_t = MatMul(z, W)``, carries ``Tanh(y_t)`` and outputs ``y_t``."""
    r = rng(seed)
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s", "x_t"], ["z"], name="scan_add"),
            _const("scan.w", weight(r, width, width, scale=0.3)),
            helper.make_node("MatMul", ["z", "scan.w"], ["y_t"], name="scan_matmul"),
            helper.make_node("Tanh", ["y_t"], ["s_next"], name="scan_tanh"),
        ],
        "scan_body",
        [tensor("s", [1, width]), tensor("x_t", [1, width])],
        [tensor("s_next", [1, width]), tensor("y_t", [1, width])],
    )
    return model(
        [
            helper.make_node(
                "Scan", ["s0", "xs"], ["s_last", "ys"], name="scan", body=body, num_scan_inputs=1
            )
        ],
        [tensor("s0", [1, width]), tensor("xs", [steps, 1, width])],
        [tensor("s_last", [1, width]), tensor("ys", [steps, 1, width])],
        name="scan_matmul",
    )


def if_in_scan(width: int = 32, steps: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A Scan whose body holds an If: the then branch's MatMul reads the scan slice ``x_t``
    (a Scan body value, stacked per step) and ``u = Relu(x_t)``, a value of the branch itself,
    which is missing on the steps the branch is not taken (a Scan output cannot stack it)."""
    r = rng(seed)
    then_graph = helper.make_graph(
        [
            _const("inner.w", weight(r, width, width, scale=0.3)),
            helper.make_node("MatMul", ["x_t", "inner.w"], ["then_a"], name="inner_matmul"),
            helper.make_node("Relu", ["x_t"], ["u"], name="inner_relu"),
            _const("inner.v", weight(r, width, width, scale=0.3)),
            helper.make_node("MatMul", ["u", "inner.v"], ["then_b"], name="branch_matmul"),
            helper.make_node("Add", ["then_a", "then_b"], ["then_y"], name="inner_add"),
        ],
        "then",
        [],
        [tensor("then_y", [1, width])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x_t"], ["else_y"], name="inner_neg")],
        "else",
        [],
        [tensor("else_y", [1, width])],
    )
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x_t"], ["total"], name="step_sum", keepdims=0),
            _const("zero", np.float32(0.0)),
            helper.make_node("Greater", ["total", "zero"], ["positive"], name="step_positive"),
            helper.make_node(
                "If",
                ["positive"],
                ["y_t"],
                name="step_if",
                then_branch=then_graph,
                else_branch=else_graph,
            ),
            helper.make_node("Identity", ["s"], ["s_next"], name="step_state"),
        ],
        "scan_body",
        [tensor("s", [1, width]), tensor("x_t", [1, width])],
        [tensor("s_next", [1, width]), tensor("y_t", [1, width])],
    )
    return model(
        [
            helper.make_node(
                "Scan", ["s0", "xs"], ["s_last", "ys"], name="scan", body=body, num_scan_inputs=1
            )
        ],
        [tensor("s0", [1, width]), tensor("xs", [steps, 1, width])],
        [tensor("s_last", [1, width]), tensor("ys", [steps, 1, width])],
        name="if_in_scan",
    )


def if_in_loop(width: int = 32, seed: int = 0) -> onnx.ModelProto:
    """A Loop whose body holds an If taken on odd iterations only (``iteration % 2``): the
    branch's MatMul input is collected on the iterations it runs."""
    r = rng(seed)
    then_graph = helper.make_graph(
        [
            _const("odd.w", weight(r, width, width, scale=0.3)),
            helper.make_node("MatMul", ["h", "odd.w"], ["odd_y"], name="odd_matmul"),
        ],
        "odd",
        [],
        [tensor("odd_y", [1, width])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["even_y"], name="even_identity")],
        "even",
        [],
        [tensor("even_y", [1, width])],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond"),
            _const("two", np.int64(2)),
            helper.make_node("Mod", ["iteration", "two"], ["parity"], name="parity"),
            helper.make_node("Cast", ["parity"], ["odd"], name="is_odd", to=BOOL),
            helper.make_node(
                "If",
                ["odd"],
                ["step_y"],
                name="step_if",
                then_branch=then_graph,
                else_branch=else_graph,
            ),
            _const("one", np.float32(1.0)),
            helper.make_node("Add", ["h", "one"], ["h_next"], name="grow"),
        ],
        "loop_body",
        [tensor("iteration", [], INT64), tensor("cond_in", [], BOOL), tensor("h", [1, width])],
        [tensor("cond_out", [], BOOL), tensor("h_next", [1, width]), tensor("step_y", [1, width])],
    )
    return model(
        [helper.make_node("Loop", ["steps", "", "h0"], ["h_last", "ys"], name="loop", body=body)],
        [tensor("h0", [1, width]), tensor("steps", [], INT64)],
        [tensor("h_last", [1, width]), tensor("ys", [None, 1, width])],
        name="if_in_loop",
    )


def batches(m: onnx.ModelProto, n: int = 4, seed: int = 0, **fixed: object) -> list[dict]:
    """``n`` batches of N(0, 1) float inputs; inputs named in ``fixed`` take that value
    (a bool condition, a step count), or a callable of the batch index."""
    r = np.random.default_rng(seed)
    out = []
    for k in range(n):
        batch = {}
        for vi in m.graph.input:
            if vi.name in fixed:
                value = fixed[vi.name]
                value = value(k) if callable(value) else value
                elem = vi.type.tensor_type.elem_type
                batch[vi.name] = np.asarray(value, helper.tensor_dtype_to_np_dtype(elem))
                continue
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            batch[vi.name] = r.standard_normal(dims).astype(np.float32)
        out.append(batch)
    return out


__all__ = [
    "FLOAT",
    "batches",
    "if_convs",
    "if_in_loop",
    "if_in_scan",
    "loop_matmul",
    "nested_if",
    "scan_matmul",
]


def nested_read_through_maxpool(seed: int = 0) -> onnx.ModelProto:
    """Inside the then branch of an If: Conv -> MaxPool whose output only a nested If reads
    (the body-level twin of the top-level case onnxruntime's Q/DQ optimizer aborted on)."""
    r = rng(seed)
    shape = [1, 16, 8, 8]
    inner_then = helper.make_graph(
        [helper.make_node("Relu", ["pooled"], ["inner_t"], name="inner_relu")],
        "inner_then",
        [],
        [tensor("inner_t", shape)],
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sigmoid", ["pooled"], ["inner_e"], name="inner_sigmoid")],
        "inner_else",
        [],
        [tensor("inner_e", shape)],
    )
    then_graph = helper.make_graph(
        [
            _const("branch.w", weight(r, 16, 16, 3, 3)),
            _conv("branch", "x", "branch.w", "branch_conv_out"),
            helper.make_node(
                "MaxPool",
                ["branch_conv_out"],
                ["pooled"],
                name="branch_pool",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            ),
            helper.make_node(
                "If",
                ["inner"],
                ["branch_y"],
                name="inner_if",
                then_branch=inner_then,
                else_branch=inner_else,
            ),
        ],
        "outer_then",
        [],
        [tensor("branch_y", shape)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["outer_e"], name="outer_neg")],
        "outer_else",
        [],
        [tensor("outer_e", shape)],
    )
    return model(
        [
            helper.make_node(
                "If",
                ["outer"],
                ["y"],
                name="outer_if",
                then_branch=then_graph,
                else_branch=else_graph,
            )
        ],
        [tensor("x", shape), tensor("outer", [], BOOL), tensor("inner", [], BOOL)],
        [tensor("y", shape)],
        name="nested_read_through_maxpool",
    )


def twin_branch_convs(seed: int = 0) -> onnx.ModelProto:
    """Both branches of an If name their weight ``w``, their conv ``conv`` and its output
    ``conv_out`` (as a function exported twice does), with different weights."""
    r = rng(seed)
    shape = [1, 16, 8, 8]

    def branch() -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node(
                    "Constant",
                    [],
                    ["w"],
                    name="const",
                    value=numpy_helper.from_array(weight(r, 16, 16, 3, 3)),
                ),
                helper.make_node("Conv", ["x", "w"], ["conv_out"], name="conv", pads=[1] * 4),
                helper.make_node("Relu", ["conv_out"], ["out"], name="relu"),
            ],
            "branch",
            [],
            [tensor("out", shape)],
        )

    return model(
        [
            helper.make_node(
                "If", ["c"], ["y"], name="if", then_branch=branch(), else_branch=branch()
            )
        ],
        [tensor("x", shape), tensor("c", [], BOOL)],
        [tensor("y", shape)],
        name="twin_branch_convs",
    )
