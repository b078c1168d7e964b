"""The report's precision split: multiply-adds and ops by precision, and why each FP32 op is
FP32."""

from __future__ import annotations

import json

import onnxq
from onnxq.materialize.precision_record import PrecisionSplit
from tests import graphs


def test_a_tensorrt_run_reports_its_split_and_the_summary_says_it():
    m = graphs.residual_add()
    result = onnxq.quantize(m, graphs.random_batches(m, 4), progress=False)
    section = json.loads(result.report.to_json())["precision"]
    assert section["high_precision"] == "fp16" and section["fp32"] == []
    assert section["macs"]["int8"] > 0 and set(section["macs"]) <= {"int8", "fp16"}
    assert section["nodes"]["fp16"] >= 1 and section["casts"] == 1
    line = next(x for x in result.report.summary().splitlines() if x.startswith("precision:"))
    assert "float compute in fp16" in line and "% int8" in line and "1 Cast(s)" in line


def test_fp32_ops_are_grouped_by_reason_with_an_example():
    split = PrecisionSplit(
        "fp16",
        (("fp16", 30), ("int8", 70)),
        (("fp16", 5), ("fp32", 3)),
        (
            ("a", "activation 'x' reaches 1e+05 on the calibration data, beyond ..."),
            ("b", "activation 'y' reaches 2e+05 on the calibration data, beyond ..."),
            ("c", "control flow: its bodies read outer tensors by name and keep their types"),
        ),
        4,
    )
    lines = split.summary_lines()
    assert lines[0] == (
        "precision: float compute in fp16; multiply-adds 30.0% fp16, 70.0% int8; "
        "ops 5 fp16, 3 fp32; 4 Cast(s) at precision boundaries"
    )
    assert lines[1].startswith("  fp32: 2 op(s), e.g. 'a': activation 'x' reaches")
    assert lines[2].startswith("  fp32: 1 op(s), e.g. 'c': control flow")
    reason = "control flow: its bodies read outer tensors by name and keep their types"
    assert split.to_dict()["precision"]["fp32"][2] == {"node": "c", "reason": reason}


def test_an_onnxruntime_run_stays_fp32_and_says_so():
    m = graphs.residual_add()
    result = onnxq.quantize(m, graphs.random_batches(m, 4), backend="onnxruntime", progress=False)
    section = result.report.to_dict()["precision"]
    assert section["high_precision"] == "fp32" and "fp16" not in section["nodes"]
    assert section["casts"] == 0
