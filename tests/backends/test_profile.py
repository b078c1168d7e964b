"""Backend profiles: the facts every other module reads."""

from __future__ import annotations

from onnxq.backends.profile import PROFILES


def test_profiles_differ_only_in_data():
    trt, ort = PROFILES["tensorrt"], PROFILES["onnxruntime"]
    assert (trt.activation_dtype, trt.activation_symmetric) == ("int8", True)
    assert (ort.activation_dtype, ort.activation_symmetric) == ("uint8", False)
    assert trt.min_channels == 16 and ort.min_channels == 0
    assert trt.bias == "float" and ort.bias == "int32"
    assert not trt.quantize_outputs and ort.quantize_outputs
    assert {"QLinearConv", "ConvInteger", "MatMulInteger"} <= trt.forbidden_ops
    assert ort.forbidden_ops == frozenset()
    assert trt.allowed_qdq_dtypes == {"int8", "float8e4m3fn"} and "uint8" in ort.allowed_qdq_dtypes
    assert trt.rule_set == "tensorrt" and ort.rule_set == "onnxruntime"
    assert trt.min_opset == ort.min_opset == 13


def test_replace_copies_a_profile():
    strict = PROFILES["onnxruntime"].replace(min_channels=32)
    assert strict.min_channels == 32 and PROFILES["onnxruntime"].min_channels == 0
    assert strict.name == "onnxruntime"
