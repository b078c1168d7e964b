"""The static checker: hand-built Q/DQ models that break one constraint each."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.errors import Violation
from tests import graphs

TRT = PROFILES["tensorrt"]
ORT = PROFILES["onnxruntime"]
ZERO_INT8 = np.int8(0)


def const(name: str, value) -> TensorProto:
    return graphs.init(name, np.asarray(value))


def qdq_conv(
    *,
    act_scale=0.05,
    act_zp=ZERO_INT8,
    act_q_zp=True,
    scale_input=False,
    act_axis_scales: int = 0,
    weight_axis: int = 0,
    opset: int = 13,
    weight_storage: str = "int8",
) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(int8 weight, per channel)) -> y, with knobs to break it.

    Node names: ``x_q``, ``x_dq``, ``w_dq`` (and ``w_q`` for ``weight_storage="qdq"``), ``conv``.
    """
    r = graphs.rng(0)
    inputs = [graphs.tensor("x", [1, 16, 8, 8])]
    w = graphs.weight(r, 16, 16, 3, 3)
    inits = [
        const("w_scale", np.full(16, 0.01, np.float32)),
        const("w_zero_point", np.zeros(16, np.int8)),
    ]
    if act_axis_scales:
        inits.append(const("x_scale", np.full(act_axis_scales, act_scale, np.float32)))
        inits.append(const("x_zero_point", np.zeros(act_axis_scales, np.int8)))
    elif scale_input:
        inputs.append(graphs.tensor("x_scale", []))
    else:
        inits.append(const("x_scale", np.float32(act_scale)))
    if not act_axis_scales:
        inits.append(const("x_zero_point", act_zp))
    axis = {"axis": 1} if act_axis_scales else {}
    q_inputs = ["x", "x_scale", "x_zero_point"] if act_q_zp else ["x", "x_scale"]
    dq_inputs = ["x_q", "x_scale", "x_zero_point"] if act_q_zp else ["x_q", "x_scale"]
    nodes = [
        helper.make_node("QuantizeLinear", q_inputs, ["x_q"], name="x_q", **axis),
        helper.make_node("DequantizeLinear", dq_inputs, ["x_dq"], name="x_dq", **axis),
    ]
    if weight_storage == "qdq":
        inits.append(const("w", w))
        nodes.append(
            helper.make_node(
                "QuantizeLinear",
                ["w", "w_scale", "w_zero_point"],
                ["w_int8"],
                name="w_q",
                axis=weight_axis,
            )
        )
    else:
        inits.append(const("w_int8", np.clip(np.rint(w / 0.01), -127, 127).astype(np.int8)))
    nodes += [
        helper.make_node(
            "DequantizeLinear",
            ["w_int8", "w_scale", "w_zero_point"],
            ["w_dq"],
            name="w_dq",
            axis=weight_axis,
        ),
        helper.make_node("Conv", ["x_dq", "w_dq"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "qdq_conv", inputs, [graphs.tensor("y", [1, 16, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = graphs.IR_VERSION
    return model


def qdq_gemm(trans_b: int, weight_axis: int) -> onnx.ModelProto:
    """x[2, 32] -> Q -> DQ -> Gemm(DQ(int8 B, axis), transB) -> y[2, 16]."""
    shape = (16, 32) if trans_b else (32, 16)
    inits = [
        const("x_scale", np.float32(0.05)),
        const("x_zero_point", np.int8(0)),
        const("b_int8", np.ones(shape, np.int8)),
        const("b_scale", np.full(shape[weight_axis], 0.01, np.float32)),
        const("b_zero_point", np.zeros(shape[weight_axis], np.int8)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_q"], name="x_q"),
        helper.make_node(
            "DequantizeLinear", ["x_q", "x_scale", "x_zero_point"], ["x_dq"], name="x_dq"
        ),
        helper.make_node(
            "DequantizeLinear",
            ["b_int8", "b_scale", "b_zero_point"],
            ["b_dq"],
            name="b_dq",
            axis=weight_axis,
        ),
        helper.make_node("Gemm", ["x_dq", "b_dq"], ["y"], name="gemm", transB=trans_b),
    ]
    return graphs.model(
        nodes, [graphs.tensor("x", [2, 32])], [graphs.tensor("y", [2, 16])], inits, opset=13
    )


def fields(violations: list[Violation]) -> set[tuple[str, str]]:
    return {(v.node, v.field) for v in violations}


# ------------------------------------------------------------------------------- clean
@pytest.mark.parametrize("storage", ["int8", "qdq"])
def test_clean_model_has_no_violations(storage):
    model = qdq_conv(weight_storage=storage)
    onnx.checker.check_model(model)
    assert check(model, TRT) == []
    assert check(model, ORT) == []


@pytest.mark.parametrize("trans_b", [0, 1])
def test_clean_gemm_has_no_violations(trans_b):
    assert check(qdq_gemm(trans_b, weight_axis=0 if trans_b else 1), TRT) == []


# ------------------------------------------------------------------------------- zero points
def test_non_zero_zero_point_breaks_tensorrt_only():
    model = qdq_conv(act_zp=np.int8(3))
    violations = check(model, TRT)
    assert fields(violations) == {("x_q", "zero_point"), ("x_dq", "zero_point")}
    assert all(v.expected == "0 (symmetric)" and v.got == "[3]" for v in violations)
    assert check(model, ORT) == []


def test_uint8_zero_point_breaks_tensorrt():
    model = qdq_conv(act_zp=np.uint8(0))
    violations = check(model, TRT)
    assert fields(violations) == {("x_q", "zero_point dtype"), ("x_dq", "zero_point dtype")}
    assert {v.got for v in violations} == {"uint8"}
    assert check(model, ORT) == []


def test_uint8_asymmetric_zero_point_is_fine_for_onnxruntime():
    model = qdq_conv(act_zp=np.uint8(128))
    assert check(model, ORT) == []
    assert ("x_q", "zero_point") in fields(check(model, TRT))


def test_missing_zero_point_on_quantize_linear_breaks_tensorrt():
    violations = check(qdq_conv(act_q_zp=False), TRT)
    assert fields(violations) == {("x_q", "zero_point")}
    assert "absent" in violations[0].got
    assert check(qdq_conv(act_q_zp=False), ORT) == []


# ------------------------------------------------------------------------------- scales
@pytest.mark.parametrize("bad", [0.0, -0.5, np.inf, np.nan])
def test_scale_must_be_positive_and_finite(bad):
    violations = check(qdq_conv(act_scale=bad), TRT)
    assert fields(violations) == {("x_q", "scale"), ("x_dq", "scale")}
    assert all(v.expected == "> 0 and finite" for v in violations)


def test_non_constant_scale():
    violations = check(qdq_conv(scale_input=True), TRT)
    assert fields(violations) == {("x_q", "scale"), ("x_dq", "scale")}
    assert all(v.got == "non-constant 'x_scale'" for v in violations)


def test_per_axis_scale_on_an_activation():
    violations = check(qdq_conv(act_axis_scales=16), TRT)
    assert fields(violations) == {("x_q", "scale"), ("x_dq", "scale")}
    assert all(v.expected == "per-tensor for an activation" for v in violations)


# ------------------------------------------------------------------------------- weight axes
@pytest.mark.parametrize("storage", ["int8", "qdq"])
def test_wrong_weight_axis_for_conv(storage):
    model = qdq_conv(weight_axis=1, weight_storage=storage)
    violations = check(model, TRT)
    nodes = {"w_dq"} if storage == "int8" else {"w_q", "w_dq"}
    assert fields(violations) == {(n, "axis") for n in nodes}
    assert all(
        v.got == "1" and v.expected.startswith("0 (output channels of Conv conv")
        for v in violations
    )


@pytest.mark.parametrize(("trans_b", "wrong_axis", "want"), [(1, 1, "0"), (0, 0, "1")])
def test_wrong_weight_axis_for_gemm_transb(trans_b, wrong_axis, want):
    violations = check(qdq_gemm(trans_b, weight_axis=wrong_axis), TRT)
    assert fields(violations) == {("b_dq", "axis")}
    assert violations[0].expected.startswith(f"{want} (output channels of Gemm gemm")
    assert violations[0].got == str(wrong_axis)


def test_scale_count_must_match_the_channel_dimension():
    model = qdq_gemm(1, weight_axis=0)
    g_init = {t.name: t for t in model.graph.initializer}
    g_init["b_scale"].CopyFrom(const("b_scale", np.full(8, 0.01, np.float32)))
    g_init["b_zero_point"].CopyFrom(const("b_zero_point", np.zeros(8, np.int8)))
    violations = check(model, TRT)
    assert fields(violations) == {("b_dq", "scale count")}
    assert violations[0].expected == "dim[0] = 16" and violations[0].got == "8 scales"


def test_axis_attribute_needs_opset_13():
    model = qdq_conv(opset=11)
    assert model.opset_import[0].version == 11
    violations = check(model, TRT)
    assert fields(violations) == {("w_dq", "axis")}
    assert violations[0].got == "opset 11"
    assert check(qdq_conv(opset=13), TRT) == []


# ------------------------------------------------------------------------------- forbidden ops
def _integer_op_model(op_type: str) -> onnx.ModelProto:
    x = graphs.tensor("x", [1, 16, 8, 8], TensorProto.UINT8)
    inits = [const("w", np.ones((16, 16, 3, 3), np.int8))]
    if op_type == "QLinearConv":
        inits += [
            const("xs", np.float32(0.1)),
            const("xz", np.uint8(0)),
            const("ws", np.float32(0.1)),
            const("wz", np.int8(0)),
            const("ys", np.float32(0.1)),
            const("yz", np.uint8(0)),
        ]
        node = helper.make_node(
            "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="qconv"
        )
        out = graphs.tensor("y", [1, 16, 6, 6], TensorProto.UINT8)
    else:
        node = helper.make_node("ConvInteger", ["x", "w"], ["y"], name="qconv")
        out = graphs.tensor("y", [1, 16, 6, 6], TensorProto.INT32)
    return graphs.model([node], [x], [out], inits, opset=13)


@pytest.mark.parametrize("op_type", ["QLinearConv", "ConvInteger"])
def test_integer_ops_are_forbidden_for_tensorrt(op_type):
    model = _integer_op_model(op_type)
    violations = check(model, TRT)
    assert fields(violations) == {("qconv", "op_type")}
    assert violations[0].got == op_type
    assert check(model, ORT) == []


def test_subgraph_qdq_may_read_outer_scope_constants():
    # A Q/DQ pair inside an If branch whose scale and zero point are initializers of the main
    # graph: valid ONNX (onnxruntime runs it), and the scale is a constant.
    then = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="inner_q"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["then_out"], name="inner_dq"),
        ],
        "then",
        [],
        [graphs.tensor("then_out", [4])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["else_out"], name="neg")],
        "else",
        [],
        [graphs.tensor("else_out", [4])],
    )
    model = graphs.model(
        [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=other)],
        [graphs.tensor("x", [4]), graphs.tensor("cond", [], TensorProto.BOOL)],
        [graphs.tensor("y", [4])],
        [const("s", np.float32(0.1)), const("z", np.int8(0))],
        opset=13,
    )
    assert check(model, TRT) == []
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.initializer[1].CopyFrom(const("z", np.int8(5)))
    assert fields(check(bad, TRT)) == {
        ("if/then_branch/inner_q", "zero_point"),
        ("if/then_branch/inner_dq", "zero_point"),
    }


def test_violation_reads_as_one_line():
    v = Violation("w_dq", "axis", "0", "1")
    assert str(v) == "w_dq: axis: expected 0, got 1"


# ------------------------------------------------------------------------------- quantize output
@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
@pytest.mark.parametrize("name", sorted(graphs.BUILDERS))
def test_quantize_output_passes_check(name, backend):
    model = graphs.BUILDERS[name]()
    result = onnxq.quantize(model, graphs.random_batches(model, 2), backend=backend, progress=False)
    assert check(result.model, PROFILES[backend]) == []
    assert result.report.violations == []
    onnx.checker.check_model(result.model)


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_quantize_output_with_qdq_weights_passes_check(backend):
    model = graphs.residual_add()
    result = onnxq.quantize(
        model,
        graphs.random_batches(model, 2),
        backend=backend,
        weight_storage="qdq",
        progress=False,
    )
    assert check(result.model, PROFILES[backend]) == []
    weight_q = [
        n
        for n in result.model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0].endswith(".weight")
    ]
    assert len(weight_q) == 2


def test_an_int32_bias_at_another_layers_scale_is_a_violation():
    from onnx import numpy_helper

    def model(bias: np.ndarray, bias_scale: float) -> onnx.ModelProto:
        inits = [
            numpy_helper.from_array(np.int8(np.ones((4, 4))), "w"),
            numpy_helper.from_array(np.float32(0.5), "sx"),
            numpy_helper.from_array(np.uint8(0), "zx"),
            numpy_helper.from_array(np.full(4, 0.1, np.float32), "sw"),
            numpy_helper.from_array(np.zeros(4, np.int8), "zw"),
            numpy_helper.from_array(bias.astype(np.int32), "b"),
            numpy_helper.from_array(np.full(4, bias_scale, np.float32), "sb"),
            numpy_helper.from_array(np.zeros(4, np.int32), "zb"),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
            helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=0),
            helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"], name="bdq", axis=0),
            helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], name="fc", transB=1),
        ]
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", 1, [2, 4])],
            [helper.make_tensor_value_info("y", 1, [2, 4])],
            inits,
        )
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    profile = PROFILES["onnxruntime"]
    assert not check(model(np.arange(4), 0.05), profile)  # 0.5 x 0.1
    (v,) = check(model(np.arange(4), 0.4), profile)
    assert v.node == "bdq" and v.field == "bias scale" and "8x" in v.got
    assert not check(model(np.zeros(4), 0.4), profile)  # zero at any scale
