"""TensorRT 11's typing rules: tiny graphs that break (or keep) one rule each."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.backends import typing_rules
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.backends.typing_rules import (
    MIXED_INPUT_TYPES,
    QDQ_SCALE_OPSET,
    QDQ_TYPE_AGREEMENT,
    TYPING_RULES,
    UNTYPED_TENSOR,
    check_typing,
)
from onnxq.errors import Violation

TRT = PROFILES["tensorrt"]
ORT = PROFILES["onnxruntime"]
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def model(nodes, inputs, outputs, inits=(), opset: int = 19, value_info=()) -> onnx.ModelProto:
    """A model of one graph, not run through onnx's checker (some break the spec on purpose)."""
    graph = helper.make_graph(
        list(nodes), "typing", list(inputs), list(outputs), list(inits), value_info=value_info
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def vi(name: str, elem: int, shape=(1, 16, 8, 8)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def init(name: str, value) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def of_rule(violations: list[Violation], rule: str) -> list[Violation]:
    return [v for v in violations if v.field.startswith(f"{rule} ")]


def qdq_conv(opset: int = 19, scale_dtype=np.float16, x_elem: int = F16) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(int8 weight, per channel), float16 bias) -> y, FP16 around the
    int8 part (node names ``x_q``, ``x_dq``, ``w_dq``, ``conv``)."""
    inits = [
        init("x_scale", scale_dtype(0.05)),
        init("x_zp", np.int8(0)),
        init("w", np.ones((16, 16, 3, 3), np.int8)),
        init("w_scale", np.full(16, 0.01, scale_dtype)),
        init("w_zp", np.zeros(16, np.int8)),
        init("bias", np.zeros(16, np.float16)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wd"], name="w_dq", axis=0),
        helper.make_node("Conv", ["xd", "wd", "bias"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    return model(nodes, [vi("x", x_elem)], [vi("y", F16)], inits, opset)


def test_add_of_float32_and_float16_is_one_violation_naming_node_and_types():
    m = model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [vi("a", F32), vi("b", F16)],
        [vi("y", F16)],
    )
    found = check(m, TRT)
    assert len(found) == 1
    (v,) = found
    assert v.node == "add"
    assert v.field.startswith(MIXED_INPUT_TYPES)
    assert "Add inputs A, B share type T" in v.field
    assert "float ('a')" in v.got and "float16 ('b')" in v.got
    assert "Cast" in str(v)


def test_conv_bias_of_another_type_than_its_input():
    m = qdq_conv()
    m.graph.initializer[-1].CopyFrom(init("bias", np.zeros(16, np.float32)))
    (v,) = check_typing(m)
    assert v.node == "conv" and v.field.startswith(MIXED_INPUT_TYPES)
    assert "X, W, B" in v.field and "float ('bias')" in v.got and "float16 ('xd')" in v.got


def test_clean_fp16_conv_with_fp16_scales_at_opset_19_conforms():
    m = qdq_conv()
    assert check(m, TRT) == []
    assert len(m.graph.value_info) == 0  # the check infers types on a copy


def test_fp16_scales_at_opset_17_need_opset_19():
    found = check_typing(qdq_conv(opset=17))
    opset = of_rule(found, QDQ_SCALE_OPSET)
    assert sorted(v.node for v in opset) == ["w_dq", "x_dq", "x_q"]
    by_node = {v.node: v for v in opset}
    assert "'x_scale'" in by_node["x_q"].field and "'w_scale'" in by_node["w_dq"].field
    assert all("opset 17" in v.got and "float16" in v.expected for v in opset)
    assert check_typing(qdq_conv(opset=19)) == []  # the same graph at 19 conforms


def test_quantize_of_fp32_input_with_fp16_scale():
    m = qdq_conv(x_elem=F32)
    found = check_typing(m)
    (v,) = of_rule(found, QDQ_TYPE_AGREEMENT)
    assert v.node == "x_q" and "x and y_scale" in v.field
    assert "x 'x' float" in v.got and "y_scale 'x_scale' float16" in v.got


def test_from_opset_23_only_a_half_scale_must_match_its_tensor():
    # Q-23 lets x and y_scale differ (an fp32 scale on fp16 x); TensorRT does not for an fp16
    # scale on fp32 x
    fine = qdq_conv(opset=23, scale_dtype=np.float32)
    x_dq = fine.graph.node[1]
    x_dq.attribute.append(helper.make_attribute("output_dtype", F16))  # fp16 from fp32 scale
    fine.graph.value_info.append(vi("xd", F16))
    assert of_rule(check_typing(fine), QDQ_TYPE_AGREEMENT) == []
    del x_dq.attribute[-1]  # without output_dtype, y has the scale's type (float)
    (v,) = of_rule(check_typing(fine), QDQ_TYPE_AGREEMENT)
    assert v.node == "x_dq" and "y 'xd' float16" in v.got and "x_scale 'x_scale' float" in v.got
    (v,) = of_rule(check_typing(qdq_conv(opset=23, x_elem=F32)), QDQ_TYPE_AGREEMENT)
    assert v.node == "x_q" and "x 'x' float" in v.got and "TensorRT" in v.expected


def test_dequantize_output_declared_in_another_type_than_its_scale():
    m = qdq_conv()
    m.graph.value_info.append(vi("wd", F32, (16, 16, 3, 3)))
    (v,) = of_rule(check_typing(m), QDQ_TYPE_AGREEMENT)
    assert v.node == "w_dq" and "y and x_scale" in v.field
    assert "y 'wd' float" in v.got and "x_scale 'w_scale' float16" in v.got


def test_an_integer_scale_is_no_float_type():
    m = qdq_conv(scale_dtype=np.float32, x_elem=F32)
    m.graph.initializer[0].CopyFrom(init("x_scale", np.int32(1)))
    found = of_rule(check_typing(m), QDQ_TYPE_AGREEMENT)
    assert sorted(v.node for v in found) == ["x_dq", "x_q"]
    assert all("int32 scale 'x_scale'" in v.got for v in found)


def test_an_untyped_tensor_is_a_violation():
    x = onnx.ValueInfoProto(name="x")  # declared without a type
    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [vi("y", F32)], opset=19)
    (v,) = check(m, TRT)
    assert v.node == "relu" and v.field.startswith(UNTYPED_TENSOR)
    assert "'x'" in v.field and "graph input declared without a type" in v.got


def test_the_output_of_a_custom_op_is_left_to_its_op():
    nodes = [
        helper.make_node("Plugin", ["x"], ["p"], name="plugin", domain="com.example"),
        helper.make_node("Relu", ["p"], ["y"], name="relu"),
    ]
    m = model(nodes, [vi("x", F32)], [vi("y", F32)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    assert check_typing(m) == []


def if_model(x_typed: bool = True) -> onnx.ModelProto:
    """``y = If(c, Relu(x), Neg(x))``: both branches read the outer ``x``."""
    out = [vi("t", F32)]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [], out)
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "else", [], out)
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    x = vi("x", F32) if x_typed else onnx.ValueInfoProto(name="x")
    return model([node], [x, vi("c", TensorProto.BOOL, ())], [vi("y", F32)])


def test_a_body_reading_an_outer_tensor_is_no_false_positive():
    assert check(if_model(), TRT) == []
    (v,) = check_typing(if_model(x_typed=False))  # the body reads: flagged there, once
    assert v.node in {"if/then_branch/relu", "if/else_branch/neg"}
    assert v.field.startswith(UNTYPED_TENSOR) and "'x'" in v.field


def test_a_model_that_inference_cannot_read_keeps_its_declared_types(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no inference")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)
    m = model(
        [
            helper.make_node("Add", ["a", "b"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["y"], name="relu"),
        ],
        [vi("a", F32), vi("b", F16)],
        [vi("y", F16)],
    )
    found = check_typing(m)  # no untyped-tensor for 's': nothing could be inferred
    assert [(v.node, v.field.split()[0]) for v in found] == [("add", MIXED_INPUT_TYPES)]


def test_only_strongly_typed_profiles_run_the_typing_rules():
    m = model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [vi("a", F32), vi("b", F16)],
        [vi("y", F16)],
    )
    assert TRT.strong_typing and not ORT.strong_typing
    assert check(m, ORT) == []
    assert [v.node for v in check(m, TRT)] == ["add"]


@pytest.mark.parametrize("rule", TYPING_RULES, ids=lambda r: r.id)
def test_every_rule_says_what_it_checks_and_where_it_comes_from(rule):
    assert rule.checks and rule.sources
    assert all(s.startswith("https://") for s in rule.sources)
    assert len({r.id for r in TYPING_RULES}) == len(TYPING_RULES)
    assert rule.find(typing_rules.typed_model(qdq_conv())) == []
