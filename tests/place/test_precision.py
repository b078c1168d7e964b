"""The precision plan: each float compute node FP16 (or BF16), or FP32 with a reason measured
or read off the graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.place.precision import FP16_LIMIT, float_activations, plan_precisions
from tests import graphs


def _chain(scale: float = 1.0) -> onnx.ModelProto:
    """x -> Mul(c) -> Relu -> Exp -> y: a float chain with nothing to quantize."""
    nodes = [
        onnx.helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
        onnx.helper.make_node("Relu", ["m"], ["r"], name="relu"),
        onnx.helper.make_node("Exp", ["r"], ["y"], name="exp"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [1, 8])],
        [graphs.tensor("y", [1, 8])],
        [graphs.init("c", np.full((1, 8), scale, np.float32))],
        opset=19,
    )


def test_every_float_node_is_low_when_the_peaks_fit():
    m = _chain()
    plan = plan_precisions(m, {"x": 1.0, "m": 1.0, "r": 1.0, "y": 2.7}, "fp16", {})
    assert plan.low == {"mul", "relu", "exp"} and plan.kept == {}


def test_an_activation_beyond_fp16_range_keeps_its_producer_and_readers_fp32():
    m = _chain()
    peaks = {"x": 1.0, "m": 1.0, "r": 1.0, "y": FP16_LIMIT * 2}
    plan = plan_precisions(m, peaks, "fp16", {})
    assert plan.low == {"mul", "relu"}
    assert "activation 'y' reaches" in plan.kept["exp"] and "65504" in plan.kept["exp"]
    bf16 = plan_precisions(m, peaks, "bf16", {})  # FP32's range: nothing kept for range
    assert bf16.low == {"mul", "relu", "exp"}


def test_tiny_values_and_unobserved_tensors_and_big_constants_stay_fp32():
    m = _chain()
    tiny = plan_precisions(m, {"x": 1.0, "m": 1e-6, "r": 1e-6, "y": 1.0}, "fp16", {})
    assert "below FP16's smallest normal value" in tiny.kept["mul"]
    lost = plan_precisions(m, {"x": 1.0, "m": 1.0, "y": 1.0}, "fp16", {"r": "a one-shot source"})
    assert lost.kept["relu"] == "activation 'r' was not observed (a one-shot source)"
    big = _chain(scale=1e6)
    plan = plan_precisions(big, {"x": 1.0, "m": 1.0, "r": 1.0, "y": 1.0}, "fp16", {})
    assert plan.kept["mul"] == "constant 'c' holds values beyond FP16's range (65504)"


def test_control_flow_and_an_fp32_plan():
    m = graphs.if_model()
    names = float_activations(m)
    plan = plan_precisions(m, dict.fromkeys(names, 1.0), "fp16", {})
    (if_node,) = (n.name for n in m.graph.node if n.op_type == "If")
    assert plan.kept[if_node].startswith("control flow")
    assert plan_precisions(m, {}, "fp32", {}).low == frozenset()


def test_float_activations_are_the_graph_inputs_and_float_node_outputs():
    m = graphs.shape_subgraph()
    names = float_activations(m)
    assert names[0] == "x"
    types = {vi.name: vi.type.tensor_type.elem_type for vi in onnxq_inferred(m)}
    assert all(types.get(n, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT for n in names)
    assert not any(types.get(n) == onnx.TensorProto.INT64 for n in names)


def onnxq_inferred(m: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inferred = onnx.shape_inference.infer_shapes(m)
    return [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_the_backend_chooses_the_default(backend):
    m = graphs.conv_relu()
    result = onnxq.quantize(m, graphs.random_batches(m, 4), backend=backend, progress=False)
    section = result.report.to_dict()["precision"]
    assert section["high_precision"] == {"tensorrt": "fp16", "onnxruntime": "fp32"}[backend]
