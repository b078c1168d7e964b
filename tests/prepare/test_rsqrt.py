"""reciprocal_sqrt_to_div: Mul(x, Reciprocal(Sqrt(v))) becomes Div(x, Sqrt(v)), outputs equal,
and onnxruntime then fuses the RMSNorm into one kernel; left alone where the reciprocal has
another reader or leaves the graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnxq.prepare.rsqrt import reciprocal_sqrt_to_div
from onnxq.prepare.simplify import simplify
from tests import graphs
from tests.prepare.test_simplify import apply, assert_same_outputs

HIDDEN = 16


def rms_norm(reader: str = "Mul", expose: bool = False, source: str = "Sqrt") -> onnx.ModelProto:
    """x[2, 3, HIDDEN] -> x * Reciprocal(Sqrt(mean(x^2) + eps)) * w -> y, as torch's dynamo
    exporter writes an RMSNorm; ``reader``: the op that reads the reciprocal with x;
    ``expose``: the reciprocal is a graph output too; ``source``: what the reciprocal inverts."""
    r = graphs.rng(0)
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], name="mean", keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["var"], name="add_eps"),
        helper.make_node(source, ["var"], ["root"], name="root"),
        helper.make_node("Reciprocal", ["root"], ["rsqrt"], name="rsqrt"),
        helper.make_node(reader, ["x", "rsqrt"], ["normed"], name="normalize"),
        helper.make_node("Mul", ["normed", "w"], ["y"], name="scale"),
    ]
    outputs = [graphs.tensor("y", [2, 3, HIDDEN])]
    if expose:
        outputs.append(graphs.tensor("rsqrt", [2, 3, 1]))
    inits = [
        graphs.init("two", np.array(2.0, np.float32)),
        graphs.init("axes", np.array([-1], np.int64)),
        graphs.init("eps", np.array(1e-5, np.float32)),
        graphs.init("w", 1.0 + graphs.weight(r, HIDDEN)),
    ]
    return graphs.model(nodes, [graphs.tensor("x", [2, 3, HIDDEN])], outputs, inits, opset=18)


def fused_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The op types onnxruntime's CPU provider runs after its own graph fusions."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return graphs.op_types(onnx.load(opts.optimized_model_filepath))


def test_rms_norm_divides_by_the_root_and_keeps_its_outputs(tmp_path):
    before = rms_norm()
    after, modified = apply(reciprocal_sqrt_to_div, before)
    assert modified
    assert "Reciprocal" not in graphs.op_types(after)
    div = next(n for n in after.graph.node if n.op_type == "Div")
    assert list(div.input) == ["x", "root"]
    assert_same_outputs(before, after)
    # what the rewrite is for: onnxruntime's RMSNorm fusion needs the Div form
    assert "SimplifiedLayerNormalization" not in fused_ops(before, tmp_path)
    assert "SimplifiedLayerNormalization" in fused_ops(after, tmp_path)


def test_simplify_runs_the_pass():
    after, fired = simplify(rms_norm())
    assert "reciprocal_sqrt_to_div" in fired
    assert graphs.count_ops(after, "Reciprocal") == 0


def test_reciprocal_read_by_another_op_stays():
    before = rms_norm(reader="Add")
    after, modified = apply(reciprocal_sqrt_to_div, before)
    assert not modified
    assert graphs.op_types(after) == graphs.op_types(before)


def test_reciprocal_that_is_a_graph_output_stays():
    after, modified = apply(reciprocal_sqrt_to_div, rms_norm(expose=True))
    assert not modified
    assert graphs.count_ops(after, "Reciprocal") == 1


def test_reciprocal_of_something_else_stays():
    after, modified = apply(reciprocal_sqrt_to_div, rms_norm(source="Abs"))
    assert not modified
    assert graphs.count_ops(after, "Reciprocal") == 1
