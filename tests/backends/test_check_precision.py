"""The checker's element-type rules (FP8, 16-bit) and its dynamic-kernel rules."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.backends.check import check
from onnxq.backends.profile import ONNXRUNTIME, TENSORRT
from onnxq.numerics.precisions import CONTRIB_DOMAIN, QTYPES


def qdq_conv(
    qtype: str = "float8e4m3fn",
    opset: int = 19,
    domain: str = "",
    zero: float = 0.0,
    w_scale: float | None = None,
) -> onnx.ModelProto:
    """x -> Q/DQ(qtype) -> Conv(W behind Q/DQ of the same type, per output channel) -> y."""
    t = QTYPES[qtype]
    r = np.random.default_rng(0)
    w = r.normal(0, 1, (4, 4, 3, 3)).astype(np.float32)
    ws = np.full(4, w_scale if w_scale is not None else np.abs(w).max() / t.qmax, np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(4, t.numpy_dtype), "wz"),
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("z", t.onnx_type, [], [zero]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_q", domain=domain),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_dq", domain=domain),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="w_q", axis=0),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="w_dq", axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else []
    )
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def fields(violations) -> set[tuple[str, str]]:
    return {(v.node, v.field) for v in violations}


def test_a_valid_fp8_model_passes():
    assert check(qdq_conv(), TENSORRT) == []


def test_fp8_needs_opset_19():
    assert ("x_q", "opset") in fields(check(qdq_conv(opset=17), TENSORRT))


def test_fp8_zero_point_must_be_zero():
    violations = check(qdq_conv(zero=2.0), TENSORRT)
    assert ("x_q", "zero_point") in fields(violations)


def test_an_fp8_weight_scale_must_cover_the_weights_amax():
    violations = check(qdq_conv(w_scale=1e-3), TENSORRT)
    assert ("w_q", "scale") in fields(violations)
    assert any("amax-based" in v.expected for v in violations)


def test_fp8_is_not_an_onnxruntime_type():
    violations = check(qdq_conv(), ONNXRUNTIME)
    assert ("x_q", "zero_point dtype") in fields(violations)


def test_sixteen_bit_pairs_need_opset_21_or_the_contrib_domain():
    # weights are int8 in every precision; the activation pair is uint16
    bad = fields(check(qdq_conv("uint16", opset=17), ONNXRUNTIME))
    assert ("x_q", "opset") in bad
    ok = fields(check(qdq_conv("uint16", opset=17, domain=CONTRIB_DOMAIN), ONNXRUNTIME))
    assert ("x_q", "opset") not in ok and ("x_q", "domain") not in ok
    assert ("x_q", "opset") not in fields(check(qdq_conv("uint16", opset=21), ONNXRUNTIME))


def test_a_16_bit_pair_is_not_a_tensorrt_type():
    assert ("x_q", "zero_point dtype") in fields(check(qdq_conv("int16", opset=21), TENSORRT))


def dynamic_matmul(scales: int = 8, weight_dtype=np.int8, constant: bool = True):
    w = np.ones((16, 8), weight_dtype)
    inits = [
        numpy_helper.from_array(np.full(scales, 0.1, np.float32), "bs"),
        numpy_helper.from_array(np.zeros(scales, np.int8), "bz"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])]
    if constant:
        inits.append(numpy_helper.from_array(w, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.INT8, [16, 8]))
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["x", "b", "bs", "bz"], ["y"], name="dq", domain=CONTRIB_DOMAIN
    )
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB_DOMAIN, 1)]
    )
    model.ir_version = 8
    return model


def test_a_valid_dynamic_kernel_passes_and_tensorrt_forbids_it():
    assert check(dynamic_matmul(), ONNXRUNTIME) == []
    assert ("dq", "op_type") in fields(check(dynamic_matmul(), TENSORRT))


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (dynamic_matmul(scales=5), "scale count"),
        (dynamic_matmul(weight_dtype=np.float32), "input 1"),
        (dynamic_matmul(constant=False), "input 1"),
    ],
)
def test_a_dynamic_kernel_with_a_wrong_weight_or_scale_is_reported(model, field):
    assert ("dq", field) in fields(check(model, ONNXRUNTIME))
