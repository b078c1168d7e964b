"""The report's warnings and notes: one pure function over the stage results, tested branch by
branch with results built in-test (no model is run)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnxq import ir
from onnxq.backends.default_session import DefaultSessionView, FusedFidelity, Latency
from onnxq.backends.profile import PROFILES
from onnxq.backends.validate import OutputFidelity
from onnxq.calibrate.engine import CalibrationResult
from onnxq.calibrate.ranges import RangeRemark
from onnxq.config import QuantConfig
from onnxq.data.inputs import InputSpec
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.annotations import Annotations
from onnxq.prepare.stage import IrDowngrade, Prepared
from onnxq.recover.bias_correction import BiasCorrectionPass
from onnxq.report.fidelity import (
    CPU_DEPLOYMENT,
    FIDELITY_WARNINGS,
    LOW_FIDELITY_HINT,
    SLOWER,
    default_session_warnings,
    latency_warning,
    verification_messages,
)
from onnxq.report.messages import (
    DYNAMIC_NOTE,
    GraphView,
    Outcome,
    bias_correction_skipped,
    budget_note,
    few_samples,
    load_notes,
    messages,
    nothing_quantized,
    opset_conversion_hint,
    profile_notes,
    range_warnings,
    unmatched_patterns,
    weight_inputs,
)
from onnxq.validate.verify import Verification
from tests import graphs

TRT = PROFILES["tensorrt"]
IMAGE = InputSpec("x", np.dtype("float32"), ("N", 3, 224, 224))
AUDIO = InputSpec("wav", np.dtype("float32"), ("N", "samples"))
TOKENS = InputSpec("ids", np.dtype("int64"), ("N", "seq"))
FEATURES = InputSpec("f", np.dtype("float32"), ("N", 64))


def prepared(**changes) -> Prepared:
    fields = dict(
        model=graphs.conv_relu(),
        source=None,
        load=ir.LoadRecord(),
        weight_inputs=[],
        ir_downgrade=None,
        reference=None,
        passes=[],
    )
    return Prepared(**{**fields, **changes})


def calibrated(samples: int, budget_sampled: int = 0) -> CalibrationResult:
    return CalibrationResult(
        {}, 4, samples=samples, sample_share=1024, budget_sampled=budget_sampled
    )


# ------------------------------------------------------------------------------ preparing
def test_load_notes_say_what_loading_changed():
    assert load_notes(prepared()) == []
    record = ir.LoadRecord(sorted_nodes=True, opset_upgrade=ir.OpsetUpgrade(9, 13))
    notes = load_notes(prepared(load=record, ir_downgrade=IrDowngrade(12, 11, "1.32.0")))
    assert notes == [
        "the model's nodes were not in topological order (ONNX requires it; onnxruntime sorts "
        "them itself): onnxq sorted them",
        "the model's opset 9 was converted to 13 (per-channel Q/DQ needs it): the output is an "
        "opset-13 model",
        "the model's IR version 12 is newer than onnxruntime 1.32.0 reads (11); it uses nothing "
        "those versions added, so onnxq calibrated it and wrote the output as IR 11",
    ]


def test_an_upgrade_to_opset_19_says_fp16_or_fp8_needs_it():
    # tensorrt's default FP16 compute (FP16 Q/DQ scales) and FP8 Q/DQ both need opset 19
    record = ir.LoadRecord(opset_upgrade=ir.OpsetUpgrade(13, 19))
    assert load_notes(prepared(load=record)) == [
        "the model's opset 13 was converted to 19 (FP16 or FP8 Q/DQ needs it): the output is "
        "an opset-19 model"
    ]


def test_an_upgrade_to_opset_21_says_int4_or_16_bit_needs_it():
    """--weights int4 (and --precision int16) convert to opset 21, not for FP8."""
    record = ir.LoadRecord(opset_upgrade=ir.OpsetUpgrade(17, 21))
    assert load_notes(prepared(load=record)) == [
        "the model's opset 17 was converted to 21 (INT4 / 16-bit Q/DQ needs it): the output is "
        "an opset-21 model"
    ]


def test_the_profile_notes_say_what_a_precision_means_for_the_output():
    assert profile_notes(TRT) == []
    fp8 = TRT.replace(validation_note="check it unfused")
    assert profile_notes(fp8) == ["check it unfused"]
    dynamic = PROFILES["onnxruntime"].replace(dynamic=True)
    assert profile_notes(dynamic) == [DYNAMIC_NOTE]
    assert "no calibration data was needed" in DYNAMIC_NOTE


def test_the_opset_hint_comes_from_the_upgrade_record():
    assert opset_conversion_hint(ir.OpsetUpgrade(11, 13)) == (
        "the model's opset 11 was converted to 13 before onnxruntime ran it: if the original "
        "runs, the conversion is at fault; re-export the model with opset >= 13"
    )


def test_weight_inputs_are_named_up_to_three():
    assert weight_inputs([]) == []
    (few,) = weight_inputs(["a", "b"])
    assert few.startswith("2 initializers were also graph inputs ('a', 'b'; an old")
    (many,) = weight_inputs(["a", "b", "c", "d", "e"])
    assert "('a', 'b', 'c' and 2 more; an old exporter's habit)" in many


def test_patterns_that_match_nothing_are_warned_about():
    graph = GraphView.of(ir.Graph(graphs.conv_relu()), TRT)
    assert unmatched_patterns(graph, QuantConfig(exclude=("conv",)).placement) == []
    (warning,) = unmatched_patterns(graph, QuantConfig(exclude=("cnv*",)).placement)
    assert warning.startswith("--exclude 'cnv*' matches no node or tensor of the model")


# ---------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    ("inputs", "hint"),
    [
        ([IMAGE], " (several crops or scales of each image help)"),
        ([AUDIO, FEATURES], " (clips of several speakers, levels and noise, or windows cut"),
        ([TOKENS, TOKENS], " (texts of the lengths and topics the model will meet help)"),
        ([FEATURES], ""),
        ([IMAGE, TOKENS], " (several crops or scales of each image help; texts of the"),
    ],
)
def test_few_samples_advice_fits_the_kinds_of_input(inputs, hint):
    (warning,) = few_samples(calibrated(8), inputs)
    assert warning.startswith("the ranges come from 8 calibration sample(s): so few rarely cover")
    tail = warning.split("representative samples", 1)[1]
    assert tail.startswith(hint) if hint else tail == ""
    if inputs == [AUDIO, FEATURES]:
        assert "image" not in warning


def test_enough_samples_or_none_known_give_no_warning():
    assert few_samples(calibrated(32), [IMAGE]) == []
    assert few_samples(calibrated(0), [IMAGE]) == []  # a cache without a sample count
    stats = TensorStats("t")
    stats.update(np.ones((3, 4), np.float32))  # 3 samples seen by the tensor
    from_stats = CalibrationResult({"t": stats}, 0, samples=0)
    assert few_samples(from_stats, [IMAGE])[0].startswith("the ranges come from 3 calibration")


def test_budget_note_only_when_the_budget_thinned_histograms():
    options = QuantConfig(histogram_budget=4096).calibration
    assert budget_note(calibrated(64), options) == []
    (note,) = budget_note(calibrated(64, budget_sampled=3), options)
    assert note.startswith("3 histogram(s) counted at most 1024 values per sample")
    assert "histogram_budget=4096" in note


def test_range_remarks_become_warnings_in_order():
    remarks = (RangeRemark("a", None), RangeRemark("b", "clipped at the 99.99th percentile"))
    assert range_warnings(remarks) == [
        "tensor 'a' produced no float values during calibration; it stays float",
        "tensor 'b': clipped at the 99.99th percentile",
    ]


# ---------------------------------------------------------------------------- the output
def test_bias_correction_skipped_says_why():
    assert bias_correction_skipped(None) == []
    assert bias_correction_skipped(BiasCorrectionPass()) == []
    assert bias_correction_skipped(BiasCorrectionPass(skipped="source read once")) == [
        "bias correction skipped: the calibration source can be read only once"
    ]
    (large,) = bias_correction_skipped(BiasCorrectionPass(skipped="model too large"))
    assert large.startswith("bias correction skipped: the model is too large")


def test_nothing_quantized_is_a_warning():
    assert nothing_quantized(3, TRT) == []
    (warning,) = nothing_quantized(0, TRT)
    assert warning.startswith("no op of this model is quantized for tensorrt")


def test_unmeasured_fidelity_says_why():
    assert verification_messages(Verification("m", [], "no batches held")) == (
        [],
        [
            "fidelity not measured: no batches were held for it (statistics from a calibration "
            "cache without --calib data, or fidelity_batches: 0)"
        ],
    )
    assert verification_messages(Verification("m", [], "no batches held (dynamic)")) == (
        [],
        [
            "fidelity not measured: no batches were held for it (--dynamic without --calib "
            "data, or fidelity_batches: 0)"
        ],
    )
    assert verification_messages(Verification("m", [], "no float copy")) == (
        ["model too large to keep a float copy: fidelity not measured"],
        [],
    )


def fidelity_warning(out: OutputFidelity) -> list[str]:
    return verification_messages(Verification("m", [out]))[0]


def test_a_faithful_output_says_nothing():
    assert verification_messages(Verification("m", [OutputFidelity("y", 0.999, 0.1, 5.0)])) == (
        [],
        [],
    )


@pytest.mark.parametrize(
    ("out", "name", "start"),
    [
        (
            OutputFidelity("y", 0.0, 0.0, 0.0, "not compared: the quantized model gives 3 values"),
            "shape changed",
            "output 'y': the quantized model gives 3 values on the held batches",
        ),
        (
            OutputFidelity("y", 0.9, 0.8, 5.0),
            "low cosine",
            "output 'y' agrees with the float model at cosine 0.900 only (< 0.95;",
        ),
        (
            OutputFidelity(
                "y",
                0.99,
                0.1,
                5.0,
                slice_axis=2,
                worst_slice=4,
                worst_slice_cosine=0.5,
                slice_peak_ratio=10.0,
            ),
            "a small-valued slice lost",
            "output 'y' agrees with the float model at cosine 0.990 as a whole, but its slice 4",
        ),
        (
            OutputFidelity("y", 0.99, 0.1, 5.0, sample_cosine_mean=0.5, worst_sample_cosine=-0.2),
            "most samples lost",
            "output 'y' agrees with the float model at cosine 0.990 over all held samples",
        ),
        (
            OutputFidelity("y", 0.99, 9.0, 5.0),
            "a few positions lost",
            "output 'y' agrees with the float model at cosine 0.990 as a whole, but some value",
        ),
        (
            OutputFidelity("y", 0.99, 0.1, 5.0, top1_agreement=0.8),
            "top-1 changed",
            "output 'y': its largest class differs from the float model's in 20.0% of its rows",
        ),
        (
            OutputFidelity("y", 0.9, 1.0, 1.0, compared="agreement"),
            "integer output differs",
            "output 'y' differs from the float model in 10.0% of its values",
        ),
    ],
)
def test_each_fidelity_warning(out, name, start):
    (rule,) = [w for w in FIDELITY_WARNINGS if w.applies(out)][:1]
    assert rule.name == name
    (warning,) = fidelity_warning(out)
    assert warning.startswith(start)


def test_only_the_first_fidelity_warning_that_applies_is_given():
    out = OutputFidelity("y", 0.5, 9.0, 5.0, top1_agreement=0.1)  # low cosine, lost, top-1
    (warning,) = fidelity_warning(out)
    assert "cosine 0.500 only" in warning and warning.endswith(LOW_FIDELITY_HINT)


def test_selected_rows_are_warned_about_only_when_they_differ():
    same = OutputFidelity("sel", 1.0, 0.0, 1.0, compared="agreement", selected_by="NMS")
    assert fidelity_warning(same) == []
    moved = OutputFidelity("sel", 0.5, 1.0, 1.0, compared="agreement", selected_by="NMS")
    (warning,) = fidelity_warning(moved)
    assert warning.startswith("output 'sel' holds the rows NMS keeps, in score order")


def test_nan_in_one_model_is_a_warning_and_nan_in_the_float_model_a_note():
    out = OutputFidelity("y", 0.999, 0.1, 5.0, nonfinite=2, nonfinite_mismatch=1)
    warnings, notes = verification_messages(Verification("m", [out]))
    assert warnings == [
        "output 'y': 1 value(s) are NaN/Inf in one model but not in the other (or a different "
        "NaN/Inf) on the held batches: int8 rounding can move a value near 0 across the domain "
        "edge of a Sqrt, Log or division, or make a sum overflow; check the ops before this "
        "output (`onnxq analyze`)"
    ]
    assert notes[0].startswith("output 'y': 2 value(s) of the float model are NaN/Inf")


# ------------------------------------------------------------- onnxruntime's default session
DIFFERS = FusedFidelity("y", "cosine", 0.990, 0.700, 0.89, 0.61, beyond_noise=True)
AGREES = FusedFidelity("z", "cosine", 0.990, 0.989, beyond_noise=False)


def test_no_default_session_or_agreeing_outputs_say_nothing():
    assert default_session_warnings(None) == []
    assert default_session_warnings(DefaultSessionView("x86-avx2", (AGREES,))) == []


@pytest.mark.parametrize(
    ("cpu", "why"),
    [
        ("x86-avx2", "without int8 dot products (VNNI) those add pairs of products in int16 sums"),
        ("x86-vnni", "those round and requantize between ops where the Q/DQ graph computes"),
        ("arm64-dot", "those round and requantize between ops where the Q/DQ graph computes"),
    ],
)
def test_a_fused_disagreement_gives_both_figures_why_for_this_cpu_and_what_to_do(cpu, why):
    (warning,) = default_session_warnings(DefaultSessionView(cpu, (DIFFERS, AGREES)))
    assert warning.startswith(f"in onnxruntime's default session on this machine ({cpu}) ")
    assert (
        "('y': cosine 0.990 (top-1 agreement 89%) unfused, cosine 0.700 (top-1 agreement 61%) "
        "fused)"
    ) in warning
    assert "'z'" not in warning and why in warning and warning.endswith(CPU_DEPLOYMENT)


def test_an_integer_output_is_given_as_the_share_of_equal_values():
    out = FusedFidelity("ids", "agreement", 1.0, 0.75, beyond_noise=True)
    (warning,) = default_session_warnings(DefaultSessionView("x86-avx2", (out,)))
    assert "'ids': 100.0% equal unfused, 75.0% equal fused" in warning


def test_a_default_session_that_cannot_run_the_model_is_a_warning_with_its_reason():
    view = DefaultSessionView("x86-avx2", failure="the quantized model fails on held batch 0")
    (warning,) = default_session_warnings(view)
    assert warning.startswith("onnxruntime's default session on this machine (x86-avx2)")
    assert "cannot run this model, though its Q/DQ graph runs: the quantized model fails" in (
        warning
    )
    assert warning.endswith(CPU_DEPLOYMENT)


def test_default_session_warnings_follow_the_unfused_figures_warnings():
    verification = Verification(
        "m",
        [OutputFidelity("y", 0.9, 0.8, 5.0)],
        default_session=DefaultSessionView("x86-avx2", (DIFFERS,)),
    )
    warnings, _ = verification_messages(verification)
    assert [w.split(" ")[0] for w in warnings] == ["output", "in"]


@pytest.mark.parametrize(
    ("latency", "said"),
    [
        (None, None),
        (Latency(1.0, 1.0, 7), None),
        (Latency(1.0, SLOWER * 0.99, 7), None),  # timing noise
        (Latency(15.1, 41.6, 7), "runs 2.75x slower than the float model (41.6 ms against 15.1"),
    ],
)
def test_latency_is_warned_about_from_a_clear_slowdown_on(latency, said):
    warning = latency_warning("x86-avx2", latency)
    if said is None:
        assert warning is None
        return
    assert warning is not None and said in warning
    assert warning.startswith("in onnxruntime's default session on this machine (x86-avx2)")
    assert "median of 7" in warning and warning.endswith(CPU_DEPLOYMENT)


# ------------------------------------------------------------------------------ together
def test_messages_come_in_the_reports_order():
    model = graphs.conv_relu()
    cfg = QuantConfig(exclude=("nothing*",))
    outcome = Outcome(
        config=cfg,
        profile=TRT,
        profile_note="weights limited to +-63",
        prepared=prepared(weight_inputs=["w"], load=ir.LoadRecord(sorted_nodes=True)),
        graph=GraphView.of(ir.Graph(model), TRT),
        inputs=[IMAGE],
        annotations=Annotations({}, [], notes=["scores note"]),
        statistics=calibrated(4, budget_sampled=1),
        remarks=(RangeRemark("t", None),),
        bias=BiasCorrectionPass(skipped="source read once"),
        placed=[],
        verification=Verification("m", [OutputFidelity("y", 0.5, 1.0, 1.0)]),
    )
    said = messages(outcome)
    assert [w.split(" ")[0] for w in said.warnings] == [
        "weights",  # the profile's note
        "tensor",  # a range remark
        "--exclude",  # a pattern that matches nothing
        "the",  # few samples
        "1",  # weight inputs
        "bias",  # bias correction skipped
        "no",  # nothing quantized
        "output",  # fidelity
    ]
    assert said.notes[0].startswith("the model's nodes were not in topological order")
    assert said.notes[1:] == ["scores note", budget_note(outcome.statistics, cfg.calibration)[0]]
    fp8 = messages(dataclasses.replace(outcome, profile=TRT.replace(validation_note="unfused")))
    assert fp8.notes[1:] == [
        "scores note",
        "unfused",  # the profile's, after placement's
        budget_note(outcome.statistics, cfg.calibration)[0],
    ]


@dataclasses.dataclass(frozen=True)
class Layerwise:
    """A weight-only run's outcome as the messages read it (report.messages.LayerwiseOutcome)."""

    config: QuantConfig
    prepared: Prepared
    graph: GraphView
    verification: Verification
    calibration_batches: int

    def notes(self) -> list[str]:
        return ["a layer note"]


def test_a_weight_only_outcome_goes_through_the_same_entry_point():
    model = graphs.conv_relu()
    outcome = Layerwise(
        config=QuantConfig(exclude=("nothing*",)),
        prepared=prepared(weight_inputs=["w"], load=ir.LoadRecord(sorted_nodes=True)),
        graph=GraphView.of(ir.Graph(model), TRT),
        verification=Verification("m", [OutputFidelity("y", 0.5, 1.0, 1.0)]),
        calibration_batches=0,
    )
    said = messages(outcome)
    assert [w.split(" ")[0] for w in said.warnings] == ["--exclude", "1"]  # no fidelity: no data
    assert said.notes[0].startswith("the model's nodes were not in topological order")
    assert said.notes[1:] == [
        "a layer note",
        "fidelity not measured: no calibration data (--calib) to run both models on",
    ]
    measured = messages(dataclasses.replace(outcome, calibration_batches=2))
    assert [w.split(" ")[0] for w in measured.warnings] == ["--exclude", "1", "output"]
    assert measured.notes[1:2] == ["a layer note"]
