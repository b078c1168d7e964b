"""Writing a precision plan: a strongly typed graph with Casts only at precision boundaries,
FP16 Q/DQ scales, graph I/O kept FP32, and what TensorRT's typing rules and onnx's strict
checker ask for."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

import onnxq
from onnxq.backends.profile import PROFILES
from onnxq.backends.typing_rules import check_typing
from onnxq.materialize.typing import write_precisions
from onnxq.place.precision import PrecisionPlan
from tests import graphs

F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


def _types(m: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    out = {v.name: v.type.tensor_type.elem_type for v in values}
    out.update({t.name: t.data_type for t in inferred.graph.initializer})
    return out


def _valid(m: onnx.ModelProto) -> None:
    onnx.checker.check_model(m, full_check=True)
    assert check_typing(m) == []
    ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(m: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, feed)[0], np.float64)


def test_a_tensorrt_output_computes_in_fp16_with_casts_only_at_its_edges():
    m = graphs.residual_add()
    batches = graphs.random_batches(m, 4)
    half = onnxq.quantize(m, batches, progress=False).model
    full = onnxq.quantize(m, batches, progress=False, high_precision="fp32").model
    _valid(half)
    types = _types(half)
    (cast,) = [n for n in half.graph.node if n.op_type == "Cast"]  # the output back to FP32
    assert cast.output[0] == "y"
    # the input needs none: its QuantizeLinear reads FP32, its DequantizeLinear writes FP16
    (q,) = [n for n in half.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x"]
    assert types[q.input[1]] == F32
    assert [i.type.tensor_type.elem_type for i in half.graph.input] == [F32]
    assert [o.type.tensor_type.elem_type for o in half.graph.output] == [F32]
    for node in half.graph.node:
        if node.op_type in ("Conv", "Add", "Relu"):
            assert {types[t] for t in [*node.input, *node.output] if t} == {F16}, node.name
        if node.op_type == "DequantizeLinear":
            assert types[node.input[1]] == F16, node.name  # FP16 scales: FP16 outputs
    assert [o.version for o in half.opset_import if o.domain in ("", "ai.onnx")] == [19]
    a, b = _run(full, batches[0]), _run(half, batches[0])
    cos = float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cos > 0.999


def test_lowered_io_types_need_no_cast_and_reruns_are_byte_identical():
    m = graphs.conv_relu()
    batches = graphs.random_batches(m, 4)
    out = onnxq.quantize(m, batches, progress=False, keep_io_types=False).model
    _valid(out)
    assert not any(n.op_type == "Cast" for n in out.graph.node)
    assert [i.type.tensor_type.elem_type for i in out.graph.input] == [F16]
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [F16]
    again = onnxq.quantize(m, batches, progress=False, keep_io_types=False).model
    assert out.SerializeToString() == again.SerializeToString()


def _float_chain() -> onnx.ModelProto:
    """x -> Mul(c) -> Sigmoid -> Add(Constant) -> Resize(scales) -> y, plus a Cast of a shape."""
    k = onnx.helper.make_tensor("k", F32, [1], [0.5])
    nodes = [
        onnx.helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
        onnx.helper.make_node("Sigmoid", ["m"], ["s"], name="sigmoid"),
        onnx.helper.make_node("Constant", [], ["k_out"], name="k", value=k),
        onnx.helper.make_node("Add", ["s", "k_out"], ["a"], name="add"),
        onnx.helper.make_node("Resize", ["a", "", "scales"], ["y"], name="resize"),
        onnx.helper.make_node("Shape", ["a"], ["shape"], name="shape"),
        onnx.helper.make_node("Cast", ["shape"], ["shape_f"], name="cast", to=F32),
        onnx.helper.make_node("Mul", ["shape_f", "c1"], ["z"], name="scale_shape"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, 2, 4, 4])],
        [graphs.tensor("y", [1, 2, 8, 8]), graphs.tensor("z", [4])],
        [
            graphs.init("c", np.full((1, 2, 1, 1), 2.0, np.float32)),
            graphs.init("scales", np.array([1, 1, 2, 2], np.float32)),
            graphs.init("c1", np.full((4,), 0.5, np.float32)),
        ],
        opset=19,
    )


def test_constants_casts_and_schema_typed_inputs():
    m = _float_chain()
    feed = {"x": graphs.rng().standard_normal((1, 2, 4, 4)).astype(np.float32)}
    want = _run(m, feed)
    plan = PrecisionPlan(
        "fp16", frozenset({"mul", "sigmoid", "add", "resize", "cast", "scale_shape"})
    )
    record = write_precisions(m, plan)
    _valid(m)
    types = _types(m)
    assert types["scales"] == F32  # Resize's scales are FLOAT alone
    assert types["s"] == types["a"] == F16 and types["shape_f"] == F16  # the Cast casts to FP16
    k = next(n for n in m.graph.node if n.op_type == "Constant")
    assert k.attribute[0].t.data_type == F16
    assert [o.type.tensor_type.elem_type for o in m.graph.output] == [F32, F32]
    assert Counter(n.op_type for n in m.graph.node)["Cast"] == 1 + 1 + 2  # its own, x, y, z
    assert record.casts == 3 and set(record.low_nodes) == set(plan.low)
    np.testing.assert_allclose(_run(m, feed), want, rtol=5e-3, atol=5e-3)


def test_an_fp32_node_between_fp16_nodes_gets_one_cast_each_way():
    m = _float_chain()
    plan = PrecisionPlan(
        "fp16", frozenset({"mul", "add", "resize"}), {"sigmoid": "kept for the test"}
    )
    write_precisions(m, plan)
    _valid(m)
    types = _types(m)
    sigmoid = next(n for n in m.graph.node if n.name == "sigmoid")
    assert types[sigmoid.input[0]] == F32 and types[sigmoid.output[0]] == F32
    add = next(n for n in m.graph.node if n.name == "add")
    assert {types[t] for t in add.input} == {F16}
    producers = {o: n for n in m.graph.node for o in n.output}
    assert producers[sigmoid.input[0]].op_type == "Cast"  # m (FP16) back into FP32
    assert producers[add.input[0]].op_type == "Cast"  # s (FP32) into FP16


def test_a_custom_domain_reader_gets_fp32_and_tensorrt_checks_the_typing():
    m = graphs.tabular(trees=True)  # ai.onnx.ml TreeEnsemble after float ops
    batches = graphs.random_batches(m, 4)
    out = onnxq.quantize(m, batches, progress=False).model
    ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    assert check_typing(out) == []
    assert PROFILES["tensorrt"].high_precision == "fp16"
    assert PROFILES["onnxruntime"].high_precision == "fp32"


def test_bf16_is_refused_in_one_line_until_onnxruntime_can_check_it():
    import pytest

    m = graphs.conv_relu()
    with pytest.raises(onnxq.ConfigError, match=r"^high_precision bf16: .* use fp16"):
        onnxq.quantize(m, graphs.random_batches(m, 2), progress=False, high_precision="bf16")
