"""The search's record as the report summary shows it (``onnxq.mixed.record``)."""

from __future__ import annotations

from types import MappingProxyType

from onnxq.mixed.record import SearchRecord, summary_lines


def record(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "target": "cosine >= 0.998",
        "met": False,
        "heldout": "the first 16 calibration batches",
        "score": 0.9955,
        "search_score": 0.9959,
        "int8_score": 0.98,
        "kept_float": [],
        "model_float_macs_fraction": 0.0999,
        "max_float_macs_fraction": 0.1,
        "trials": 181,
    }
    return {**base, **changes}


def test_summary_names_the_ceiling_and_the_trials_score_where_it_differs():
    line = summary_lines(record())[0]
    assert "NOT met" in line and "(ceiling 10.0%)" in line
    assert "the search's trial: 0.9959" in line


def test_summary_without_ceiling_or_recovery_says_neither():
    line = summary_lines(record(max_float_macs_fraction=None, search_score=0.9955, met=True))[0]
    assert "ceiling" not in line and "trial:" not in line and " met " in line


def test_search_record_is_the_reports_mixed_precision_entry_and_its_lines():
    layer = {"node": "conv", "op_type": "Conv", "gain": 0.01, "macs": 1200, "macs_share": 0.25}
    data = record(kept_float=[layer], met=True)
    section = SearchRecord(MappingProxyType(data))
    assert section.to_dict() == {"mixed_precision": data}
    lines = section.summary_lines()
    assert lines == summary_lines(data)
    assert lines[1] == "  float: conv (Conv) gain 0.01, 1,200 MACs (25.00% of the model)"
    assert "1 layer(s) kept float; 10.0% of the model's multiply-adds are float" in lines[0]
