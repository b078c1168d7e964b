"""FP16/BF16 models: widened to FP32 while onnxq works on them, quantized, and given back
their input and output types."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq.backends.typing_rules import check_typing
from onnxq.prepare.upcast import half_types, upcast
from tests import graphs

F16 = onnx.TensorProto.FLOAT16


def half_conv(m: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """A float model (conv_relu) in FP16 throughout: weights, inputs and outputs."""
    m = m if m is not None else graphs.conv_relu()
    for i, t in enumerate(m.graph.initializer):
        value = onnx.numpy_helper.to_array(t).astype(np.float16)
        m.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(value, t.name))
    for vi in [*m.graph.input, *m.graph.output]:
        vi.type.tensor_type.elem_type = F16
    return m


def mixed_with_casts() -> onnx.ModelProto:
    """FP32 input -> Cast(FP16) -> Mul(FP16 constant) -> Cast(FP32) -> output."""
    nodes = [
        onnx.helper.make_node("Cast", ["x"], ["h"], name="to_half", to=F16),
        onnx.helper.make_node("Mul", ["h", "c"], ["m"], name="mul"),
        onnx.helper.make_node("Cast", ["m"], ["y"], name="to_float", to=onnx.TensorProto.FLOAT),
    ]
    c = onnx.numpy_helper.from_array(np.full((1, 4), 0.5, np.float16), "c")
    return graphs.model(
        nodes, [graphs.tensor("x", [1, 4])], [graphs.tensor("y", [1, 4])], [c], opset=19
    )


def test_upcast_widens_every_half_tensor_exactly_and_keeps_the_io_types():
    m = half_conv()
    before = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    assert half_types(m) == {F16}
    io = upcast(m)
    assert io == {"x": F16, "y": F16} and half_types(m) == set()
    for t in m.graph.initializer:
        assert t.data_type == onnx.TensorProto.FLOAT
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), before[t.name])
    mixed = mixed_with_casts()
    assert upcast(mixed) == {}  # FP32 inputs and outputs: nothing to give back
    assert [a.i for n in mixed.graph.node for a in n.attribute] == [1, 1]  # Casts to FP32
    assert upcast(graphs.conv_relu()) == {}  # an FP32 model is left alone


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_an_fp16_model_is_quantized_and_keeps_its_fp16_inputs_and_outputs(backend):
    m = half_conv(graphs.residual_add())
    batches = [{"x": b["x"].astype(np.float16)} for b in graphs.random_batches(m, 4)]
    result = onnxq.quantize(m, batches, backend=backend, progress=False)
    out = result.model
    assert any(n.op_type == "QuantizeLinear" for n in out.graph.node)
    assert [i.type.tensor_type.elem_type for i in out.graph.input] == [F16]
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [F16]
    onnx.checker.check_model(out, full_check=True)
    if backend == "tensorrt":
        assert check_typing(out) == []
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, batches[0])
    assert y.dtype == np.float16
    assert result.report.fidelity[0].cosine > 0.99
    assert any("computes in float16" in n for n in result.report.notes)
    assert m.graph.initializer[0].data_type == F16  # the input is never modified
    kind = {"tensorrt": "fp16", "onnxruntime": "fp32"}[backend]  # the backend's high precision
    assert result.report.to_dict()["precision"]["high_precision"] == kind


def test_a_model_mixing_fp16_and_fp32_through_casts_is_quantized_as_one_plan():
    m = mixed_with_casts()
    batches = graphs.random_batches(m, 4)
    out = onnxq.quantize(m, batches, progress=False).model
    onnx.checker.check_model(out, full_check=True)
    assert check_typing(out) == []
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, batches[0])
    np.testing.assert_allclose(y, batches[0]["x"] * 0.5, rtol=2e-3)


def test_a_weight_only_run_keeps_the_models_types_and_says_what_it_cannot_take():
    m = half_conv(graphs.matmul_const())
    with pytest.raises(onnxq.UnsupportedModelError, match="constant 2-D float32 weight"):
        onnxq.quantize(m, weight_only="int8", progress=False)
