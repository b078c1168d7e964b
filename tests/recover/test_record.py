"""The recovery steps' and bias correction's records as the report shows them
(``onnxq.recover.record``)."""

from __future__ import annotations

from onnxq.recover.bias_correction import BiasCorrection, BiasCorrectionPass
from onnxq.recover.record import BiasCorrectionRecord, RecoveryRecord
from onnxq.recover.stages import Recovery


def correction(node: str, corrected: int, max_shift: float) -> BiasCorrection:
    return BiasCorrection(node, f"{node}.bias", 16, corrected, max_shift, max_shift / 2, 1.0)


def test_a_run_without_recovery_adds_no_entry_and_no_line():
    for record in (RecoveryRecord.of(None), RecoveryRecord.of(Recovery())):
        assert record.to_dict() == {}
        assert record.summary_lines() == []


def test_recovery_record_holds_the_steps_and_names_each_in_one_line():
    steps = {
        "cle": {"equalized": 3, "pairs": [{}, {}, {}, {}]},
        "calibration": {"passes": 2},
        "range_search": {"changed": 1, "tensors": ["a", "b"]},
    }
    recovery = Recovery(sections=dict(steps))
    record = RecoveryRecord.of(recovery)
    recovery.sections["smoothquant"] = {"alpha": 0.5, "tensors": [], "candidates": 0}
    assert record.to_dict() == {"recovery": steps}  # a copy: later steps do not leak in
    assert record.summary_lines() == [
        "recovery: CLE equalized 3 of 4 Conv pairs; prefix calibration (2 passes); "
        "range search changed 1 of 2 ranges"
    ]


def test_bias_correction_record_always_lists_its_corrections():
    assert BiasCorrectionRecord.of(None).to_dict() == {"bias_corrections": []}
    assert BiasCorrectionRecord.of(BiasCorrectionPass(skipped="source read once")).to_dict() == {
        "bias_corrections": []
    }
    assert BiasCorrectionRecord.of(None).summary_lines() == []


def test_bias_correction_record_counts_channels_and_names_the_largest_shift():
    run = BiasCorrectionPass([correction("conv1", 12, 0.25), correction("fc", 3, 0.0123456)])
    record = BiasCorrectionRecord.of(run)
    (first, second) = record.to_dict()["bias_corrections"]
    assert first == {
        "node": "conv1",
        "bias": "conv1.bias",
        "channels": 16,
        "corrected": 12,
        "max_shift": 0.25,
        "mean_abs_shift": 0.125,
        "bias_max_abs": 1.0,
    }
    assert second["node"] == "fc" and second["corrected"] == 3
    assert record.summary_lines() == [
        "bias correction: 15 channels of 2 layers shifted back (largest 0.25 in conv1)"
    ]
