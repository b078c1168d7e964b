"""Control-flow bodies in the IR: model-wide unique names, body indexes that read the enclosing
scope, shape inference and bias unsharing inside bodies, simplify inside bodies."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxq import ir
from onnxq.prepare.simplify import simplify
from tests import control_flow_graphs as cf
from tests import graphs


def run(model: onnx.ModelProto, batch: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, batch)


def branch(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    """The graph attribute ``name`` of ``node``."""
    return next(a.g for a in node.attribute if a.name == name)


def twin_branches() -> onnx.ModelProto:
    """Both branches define ``t`` and ``w`` and name their nodes alike (as exporters do), and
    the then branch reads a top-level ``t0``; the else branch shadows it with its own."""

    def body(scale: float) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node(
                    "Constant",
                    [],
                    ["w"],
                    name="const",
                    value=numpy_helper.from_array(np.float32(scale), "w"),
                ),
                helper.make_node("Mul", ["t0", "w"], ["t"], name="mul"),
                helper.make_node("Relu", ["t"], ["out"], name="relu"),
            ],
            "branch",
            [],
            [graphs.tensor("out", [4])],
        )

    return graphs.model(
        [
            helper.make_node("Neg", ["x"], ["t0"], name="neg"),
            helper.make_node(
                "If", ["c"], ["y"], name="if", then_branch=body(2.0), else_branch=body(-3.0)
            ),
        ],
        [graphs.tensor("x", [4]), graphs.tensor("c", [], TensorProto.BOOL)],
        [graphs.tensor("y", [4])],
    )


def test_names_are_made_unique_across_the_model_and_the_model_computes_the_same():
    model = twin_branches()
    batches = [{"x": np.arange(4, dtype=np.float32) - 2, "c": np.array(c)} for c in (True, False)]
    before = [run(model, b) for b in batches]
    ir.name_nodes(model.graph)
    names = [n.name for n in ir.every_node(model.graph)]
    assert len(names) == len(set(names)) == 8
    values = [o for n in ir.every_node(model.graph) for o in n.output]
    assert len(values) == len(set(values))
    onnx.checker.check_model(model, full_check=True)
    for batch, want in zip(batches, before, strict=True):
        np.testing.assert_array_equal(run(model, batch)[0], want[0])
    ir.name_nodes(model.graph)  # a second pass has nothing left to rename
    assert [n.name for n in ir.every_node(model.graph)] == names


def test_a_body_index_reads_outer_constants_and_types():
    model = ir.infer_shapes(cf.if_convs())
    top = ir.Graph(model)
    scopes = ir.scopes(top)
    # onnx.helper writes a node's attributes in name order: else_branch, then_branch
    assert [getattr(s, "body", None) and s.body.key for s in scopes] == [
        None,
        "if/else_branch",
        "if/then_branch",
    ]
    else_graph, then_graph = scopes[1], scopes[2]
    assert then_graph.is_const("then.w") and else_graph.is_const("else.w")  # local / outer
    assert else_graph.const_value("else.w").shape == (16, 16, 3, 3)
    assert not else_graph.is_const("x") and else_graph.shape("x") == (1, 16, 8, 8)
    assert else_graph.elem_type("x") == TensorProto.FLOAT
    assert then_graph.shape("then_conv_out") == (1, 16, 8, 8)  # inferred inside the body
    assert "x" in top.subgraph_reads and "else.w" in top.subgraph_reads
    index = ir.scope_index(scopes)
    assert index["then_out"] is then_graph and index["x"] is top
    # fresh names are unique across the model, not only in their own graph
    assert then_graph.unique_name("else_conv_out") != "else_conv_out"


def test_nested_bodies_are_indexed_depth_first():
    keys = [s.body.key for s in ir.scopes(ir.Graph(cf.nested_if()))[1:]]
    assert keys == [  # attributes in name order (onnx.helper's)
        "outer_if/else_branch",
        "outer_if/then_branch",
        "inner_if/else_branch",
        "inner_if/then_branch",
    ]


def test_a_bias_shared_across_scopes_is_unshared_in_the_readers_graph():
    def body(tag: str) -> onnx.GraphProto:
        conv = helper.make_node("Conv", ["x", "w", "b"], [tag], name=tag, pads=[1, 1, 1, 1])
        return helper.make_graph([conv], tag, [], [graphs.tensor(tag, [1, 16, 8, 8])])

    r = graphs.rng(0)
    model = graphs.model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="outer", pads=[1, 1, 1, 1]),
            helper.make_node(
                "If", ["flag"], ["y"], name="if", then_branch=body("t"), else_branch=body("e")
            ),
        ],
        [graphs.tensor("x", [1, 16, 8, 8]), graphs.tensor("flag", [], TensorProto.BOOL)],
        [graphs.tensor("c", [1, 16, 8, 8]), graphs.tensor("y", [1, 16, 8, 8])],
        [
            graphs.init("w", graphs.weight(r, 16, 16, 3, 3)),
            graphs.init("b", graphs.weight(r, 16)),
        ],
    )
    batch = {"x": graphs.weight(r, 1, 16, 8, 8), "flag": np.array(False)}
    want = run(model, batch)
    assert ir.unshare_biases(model.graph) == 2
    readers = {n.name: n.input[2] for n in ir.every_node(model.graph) if n.op_type == "Conv"}
    assert len(set(readers.values())) == 3  # each reader its own bias; the last keeps "b"
    assert readers["t"] == "b"
    # a copy lies in its reader's own graph
    assert {t.name for t in model.graph.initializer} == {"w", "b", readers["outer"]}
    assert [t.name for t in branch(model.graph.node[1], "else_branch").initializer] == [
        readers["e"]
    ]
    onnx.checker.check_model(model, full_check=True)
    for got, expected in zip(run(model, batch), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_simplify_works_inside_bodies_and_keeps_the_outputs():
    model = ir.infer_shapes(cf.if_convs())
    batches = cf.batches(model, 2, use_then=lambda k: k == 0)
    before = [run(model, b)[0] for b in batches]
    simplified, passes = simplify(model)
    then_graph = branch(simplified.graph.node[0], "then_branch")
    assert "constants_to_initializers" in passes
    assert not any(n.op_type == "Constant" for n in then_graph.node)
    assert [t.name for t in then_graph.initializer] == ["then.w"]
    for batch, want in zip(batches, before, strict=True):
        np.testing.assert_allclose(run(simplified, batch)[0], want, rtol=1e-5, atol=1e-6)
