"""The precision table: element types, their rounding against onnxruntime's QuantizeLinear,
domains and opsets, and the per-tensor checks of an override's bits."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxq.errors import ConfigError
from onnxq.numerics.precisions import (
    CONTRIB_DOMAIN,
    PRECISIONS,
    QTYPES,
    activation_qtype,
    check_bits,
    precision,
    qtype_of,
    tensor_qtype,
)


def ort_quantize(x: np.ndarray, scale: float, qtype_name: str, opset: int, domain: str = ""):
    """onnxruntime's QuantizeLinear -> DequantizeLinear of ``x`` (per tensor, zero point 0)."""
    qtype = QTYPES[qtype_name]
    inits = [
        helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("z", qtype.onnx_type, [], [0]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=domain),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=domain),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        inits,
    )
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else []
    )
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def ort_runs_fp8() -> str | None:
    """None when onnxruntime's CPU provider runs FP8 Q/DQ, else why not (a skip reason)."""
    try:
        ort_quantize(np.ones(2, np.float32), 1.0, "float8e4m3fn", 19)
    except Exception as exc:  # onnxruntime's own error types differ between versions
        return f"onnxruntime {ort.__version__} CPU has no FP8 QuantizeLinear: {exc}"[:200]
    return None


FP8_MISSING = ort_runs_fp8()


@pytest.mark.skipif(FP8_MISSING is not None, reason=FP8_MISSING or "")
def test_fp8_cast_rounds_and_saturates_as_onnxruntime_quantizelinear():
    x = np.concatenate(
        [np.linspace(-600, 600, 401), np.geomspace(1e-4, 3, 200), [0.0, 448.0, 449.0, -1e6]]
    ).astype(np.float32)
    fp8 = QTYPES["float8e4m3fn"]
    mine = fp8.cast(x / np.float32(0.5)).astype(np.float32) * np.float32(0.5)
    np.testing.assert_array_equal(mine, ort_quantize(x, 0.5, "float8e4m3fn", 19))
    assert np.all(np.isfinite(mine)) and np.abs(mine).max() == 448 * 0.5  # saturates, no NaN


@pytest.mark.parametrize(
    ("name", "opset", "domain"), [("int16", 21, ""), ("int16", 17, CONTRIB_DOMAIN)]
)
def test_int16_cast_rounds_and_saturates_as_onnxruntime(name, opset, domain):
    x = np.linspace(-400, 400, 999).astype(np.float32)
    qtype = QTYPES[name]
    mine = qtype.cast(x / np.float32(0.01)).astype(np.float32) * np.float32(0.01)
    np.testing.assert_allclose(mine, ort_quantize(x, 0.01, name, opset, domain), atol=1e-6)
    assert mine.max() == pytest.approx(327.67, abs=1e-3)


def test_sixteen_bit_pairs_use_the_contrib_domain_below_opset_21():
    assert QTYPES["uint16"].domain_for(17) == CONTRIB_DOMAIN
    assert QTYPES["uint16"].domain_for(21) == ""
    assert QTYPES["uint8"].domain_for(13) == ""
    assert QTYPES["float8e4m3fn"].domain_for(17) == ""  # no domain takes it: the opset must
    assert QTYPES["float8e4m3fn"].min_opset == 19


def test_each_type_is_found_from_its_onnx_type():
    for qtype in QTYPES.values():
        assert qtype_of(qtype.onnx_type) is qtype
        assert qtype.zeros((2,)).dtype == qtype.numpy_dtype
    assert qtype_of(TensorProto.FLOAT) is None


def test_activation_type_follows_the_backends_signedness():
    assert activation_qtype("int16", "uint8").name == "uint16"
    assert activation_qtype("int16", "int8").name == "int16"
    assert activation_qtype("fp8", "int8").name == "float8e4m3fn"
    assert tensor_qtype("weight", "int16", "uint8").name == "int8"  # A16W8
    assert tensor_qtype("weight", "fp8", "int8").name == "float8e4m3fn"
    assert set(PRECISIONS) == {"int8", "int16", "fp8"}


def test_an_unknown_precision_names_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown precision 'int4'; valid: int8, int16, fp8"):
        precision("int4")


def test_bits_must_fit_the_tensors_type():
    check_bits(12, QTYPES["uint16"], "x")
    check_bits(None, QTYPES["float8e4m3fn"], "x")
    with pytest.raises(ConfigError, match=r"bits=12 for tensor 'w'.*int8 \(8 bits"):
        check_bits(12, QTYPES["int8"], "w")
    with pytest.raises(ConfigError, match="narrows integer types only"):
        check_bits(4, QTYPES["float8e4m3fn"], "x")
