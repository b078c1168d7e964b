"""The report's warnings and notes, built from the stage results by one pure function.

:func:`messages` reads an :class:`Outcome` (what each stage returned) and says in words what
deserves a warning (something the user should check or fix) or a note (a choice onnxq made).
Nothing here runs a model or parses a message: each sentence comes from data, and is built
from data about the model (its inputs' kinds, its ops), not from fixed assumptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.backends.validate import DOMINATED, SHAPE_CHANGED, OutputFidelity
from onnxq.bias_correction import BiasCorrectionPass
from onnxq.calibrate import CalibrationResult
from onnxq.inputs import InputSpec, input_kind
from onnxq.options import CalibrationOptions, PlacementOptions
from onnxq.place.annotations import Annotations
from onnxq.prepare import Prepared
from onnxq.ranges import RangeRemark
from onnxq.verify import Verification

MIN_SAMPLES = 32  # calibration samples below which the report warns that ranges may not cover
LOW_FIDELITY = 0.95  # output cosine (or top-1 agreement) below which the report warns
LOW_FIDELITY_HINT = (
    "check it on your metric; `onnxq analyze` ranks the tensors that lose "
    "most, and --exclude keeps their ops float"
)
# what helps calibration cover the inputs, per kind of input (onnxq.inputs.input_kind)
SAMPLE_HINTS = {
    "image": "several crops or scales of each image help",
    "audio": "clips of several speakers, levels and noise, or windows cut from longer "
    "recordings, help",
    "tokens": "texts of the lengths and topics the model will meet help",
}


@dataclass(frozen=True)
class Outcome:
    """What the stages of one run returned, as far as the messages need it."""

    profile: BackendProfile
    profile_note: str
    prepared: Prepared
    graph: ir.Graph  # the simplified graph placement saw
    inputs: list[InputSpec]
    placement: PlacementOptions
    calibration: CalibrationOptions
    annotations: Annotations
    statistics: CalibrationResult
    remarks: tuple[RangeRemark, ...]
    bias: BiasCorrectionPass | None
    placed: int  # tensors that got Q/DQ
    verification: Verification


@dataclass(frozen=True)
class Messages:
    """The report's warnings and notes, in order."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def messages(outcome: Outcome) -> Messages:
    """Every warning and note of a run, in the order the report lists them."""
    o = outcome
    fidelity_warnings, fidelity_notes = verification_messages(o.verification)
    warnings = [
        *([o.profile_note] if o.profile_note else []),
        *range_warnings(o.remarks),
        *unmatched_patterns(o.graph, o.placement),
        *few_samples(o.statistics, o.inputs),
        *half_precision(o.graph, o.profile),
        *weight_inputs(o.prepared.weight_inputs),
        *bias_correction_skipped(o.bias),
        *nothing_quantized(o.placed, o.profile),
        *fidelity_warnings,
    ]
    notes = [
        *load_notes(o.prepared),
        *o.annotations.notes,
        *budget_note(o.statistics, o.calibration),
        *fidelity_notes,
    ]
    return Messages(warnings, notes)


def opset_conversion_hint(upgrade: ir.OpsetUpgrade) -> str:
    """What to add to an onnxruntime failure on a model whose opset onnxq converted."""
    return (
        f"the model's opset {upgrade.from_opset} was converted to {upgrade.to_opset} before "
        "onnxruntime ran it: if the original runs, the conversion is at fault; re-export the "
        f"model with opset >= {upgrade.to_opset}"
    )


# ------------------------------------------------------------------------------ preparing
def load_notes(prepared: Prepared) -> list[str]:
    """What loading and preparing changed in the model."""
    notes = []
    if prepared.load.sorted_nodes:
        notes.append(
            "the model's nodes were not in topological order (ONNX requires it; "
            "onnxruntime sorts them itself): onnxq sorted them"
        )
    if (up := prepared.load.opset_upgrade) is not None:
        notes.append(
            f"the model's opset {up.from_opset} was converted to {up.to_opset} (per-channel "
            f"Q/DQ needs it): the output is an opset-{up.to_opset} model"
        )
    if (ir_ := prepared.ir_downgrade) is not None:
        notes.append(
            f"the model's IR version {ir_.from_ir} is newer than onnxruntime {ir_.onnxruntime} "
            f"reads ({ir_.to_ir}); it uses nothing those versions added, so onnxq calibrated "
            f"it and wrote the output as IR {ir_.to_ir}"
        )
    return notes


def weight_inputs(names: list[str]) -> list[str]:
    """Initializers that were also graph inputs (an old exporter's habit)."""
    if not names:
        return []
    shown = ", ".join(repr(n) for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return [
        f"{len(names)} initializers were also graph inputs ({shown}{more}; an old "
        "exporter's habit): they are plain weights in the output, no longer inputs"
    ]


def unmatched_patterns(graph: ir.Graph, options: PlacementOptions) -> list[str]:
    """A warning for each exclude pattern or override that matches nothing in the model."""
    nodes = [(n.name, n.op_type) for n in graph.nodes]
    tensors = {t for n in graph.nodes for t in (*n.input, *n.output) if t}
    return [
        f"{what} matches no node or tensor of the model (after simplification; "
        "`onnxq explain MODEL` lists the node names): it changes nothing"
        for what in options.unmatched(nodes, tensors)
    ]


def half_precision(graph: ir.Graph, profile: BackendProfile) -> list[str]:
    """Why a float16/bfloat16 model comes out with nothing quantized, and what to do."""
    half = [
        n.name
        for n in graph.nodes
        if n.op_type in profile.weight_axes
        and n.input
        and graph.elem_type(n.input[0]) in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    ]
    if not half:
        return []
    return [
        f"{len(half)} {'/'.join(sorted(profile.weight_axes))} op(s) compute in float16 or "
        f"bfloat16 (first: {half[0]!r}); onnxq quantizes float32 tensors, so they stay "
        "float: quantize the float32 original instead (TensorRT still builds it with FP16 "
        "and INT8 enabled)"
    ]


# ---------------------------------------------------------------------------- calibration
def few_samples(statistics: CalibrationResult, inputs: list[InputSpec]) -> list[str]:
    """A warning when the ranges come from fewer than :data:`MIN_SAMPLES` samples, with what
    helps for the kinds of data the model takes."""
    samples = statistics.samples or max(
        (s.samples for s in statistics.stats.values() if s.count), default=0
    )
    if not samples or samples >= MIN_SAMPLES:
        return []
    kinds = dict.fromkeys(input_kind(spec) for spec in inputs)
    hints = "; ".join(SAMPLE_HINTS[kind] for kind in kinds if kind in SAMPLE_HINTS)
    return [
        f"the ranges come from {samples} calibration sample(s): so few rarely cover the "
        f"inputs the model will meet; give at least {MIN_SAMPLES}, better 64-512, "
        f"representative samples" + (f" ({hints})" if hints else "")
    ]


def budget_note(statistics: CalibrationResult, options: CalibrationOptions) -> list[str]:
    """A note when ``histogram_budget`` made some histograms sample more sparsely."""
    if not statistics.budget_sampled:
        return []
    return [
        f"{statistics.budget_sampled} histogram(s) counted at most {statistics.sample_share} "
        f"values per sample (of histogram_sample={options.histogram_sample}): "
        f"histogram_budget={options.histogram_budget} values per tensor over the whole "
        "calibration; min and max saw every value"
    ]


def range_warnings(remarks: tuple[RangeRemark, ...]) -> list[str]:
    """What the range methods had to say, tensor by tensor."""
    return [
        f"tensor {r.tensor!r} produced no float values during calibration; it stays float"
        if r.note is None
        else f"tensor {r.tensor!r}: {r.note}"
        for r in remarks
    ]


# -------------------------------------------------------------------------- the output
def bias_correction_skipped(run: BiasCorrectionPass | None) -> list[str]:
    """Why bias correction, asked for, did not run."""
    if run is None or run.skipped is None:
        return []
    why = {
        "source read once": "the calibration source can be read only once",
        "model too large": "the model is too large to hold its quantized weights next to the "
        "float ones",
    }
    return [f"bias correction skipped: {why[run.skipped]}"]


def nothing_quantized(placed: int, profile: BackendProfile) -> list[str]:
    """A model that came out with no Q/DQ at all."""
    if placed:
        return []
    return [
        f"no op of this model is quantized for {profile.name} (the reasons are under 'left "
        "float'): the output computes exactly what the input model does"
    ]


def verification_messages(verification: Verification) -> tuple[list[str], list[str]]:
    """(warnings, notes) about the quantized model's fidelity."""
    if verification.unmeasured == "no batches held":
        return [], [
            "fidelity not measured: no batches were held for it (statistics from a "
            "calibration cache without --calib data, or fidelity_batches: 0)"
        ]
    if verification.unmeasured == "no float copy":
        return ["model too large to keep a float copy: fidelity not measured"], []
    warnings: list[str] = []
    notes: list[str] = []
    for out in verification.fidelity:
        if out.selected_by:
            if _differs(out):
                warnings.append(_selected_rows(out))
            continue
        if out.nonfinite_mismatch:
            warnings.append(_nonfinite_mismatch(out))
        if out.nonfinite:
            notes.append(
                f"output {out.name!r}: {out.nonfinite} value(s) of the float model are NaN/Inf "
                "on the held batches (e.g. Sqrt or Log of a negative input); its cosine and "
                "error cover the values finite in both models"
            )
        first = next((w for w in FIDELITY_WARNINGS if w.applies(out)), None)
        if first is not None:
            warnings.append(first.text(out))
    return warnings, notes


@dataclass(frozen=True)
class FidelityWarning:
    """One way an output can disagree with the float model: when it applies, and what to say."""

    name: str
    applies: Callable[[OutputFidelity], bool]
    text: Callable[[OutputFidelity], str]


def _differs(out: OutputFidelity) -> bool:
    """Whether an output's comparison would give a warning of any kind."""
    if out.compared == "cosine":
        return out.cosine < LOW_FIDELITY or (
            out.worst_slice_cosine is not None and out.worst_slice_cosine < LOW_FIDELITY
        )
    return out.compared != "agreement" or out.cosine < 1.0


def _selected_rows(out: OutputFidelity) -> str:
    return (
        f"output {out.name!r} holds the rows {out.selected_by} keeps, in score order, and "
        f"differs from the float model's position by position ({out.difference()}): the "
        "quantized model can keep other detections or order them differently, so this "
        "comparison says little; match the detections (e.g. by IoU) on your metric, and "
        "`onnxq analyze` compares the scores and boxes before the selection"
    )


def _nonfinite_mismatch(out: OutputFidelity) -> str:
    return (
        f"output {out.name!r}: {out.nonfinite_mismatch} value(s) are NaN/Inf in one model "
        "but not in the other (or a different NaN/Inf) on the held batches: int8 "
        "rounding can move a value near 0 across the domain edge of a Sqrt, Log or "
        "division, or make a sum overflow; check the ops before this output "
        "(`onnxq analyze`)"
    )


def _cosine(out: OutputFidelity) -> bool:
    return out.compared == "cosine"


# in order: the first that applies to an output is its warning
FIDELITY_WARNINGS: tuple[FidelityWarning, ...] = (
    FidelityWarning(
        "shape changed",
        lambda out: out.compared.startswith(SHAPE_CHANGED),
        lambda out: (
            f"output {out.name!r}: {out.compared.removeprefix('not compared: ')} on the held "
            "batches: the quantized model computes a different shape (a length rounded from "
            "activations, as a TTS duration predictor does, or a random draw); keep the ops "
            "that decide it float (--exclude), and check the output on your metric"
        ),
    ),
    FidelityWarning(
        "low cosine",
        lambda out: _cosine(out) and out.cosine < LOW_FIDELITY,
        lambda out: (
            f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
            f"only (< {LOW_FIDELITY}; max abs error {out.max_abs_error:.3g}, float range "
            f"{out.float_max_abs:.3g}): {LOW_FIDELITY_HINT}"
        ),
    ),
    FidelityWarning(
        "a small-valued slice lost",
        lambda out: (
            out.worst_slice_cosine is not None
            and out.worst_slice_cosine < LOW_FIDELITY
            and (out.slice_peak_ratio or 1.0) >= DOMINATED
        ),
        lambda out: (
            f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
            f"as a whole, but its slice {out.worst_slice} along axis {out.slice_axis} only "
            f"at {out.worst_slice_cosine:.3f} (< {LOW_FIDELITY}), and its slices' float "
            f"peaks differ by {out.slice_peak_ratio:.3g}x: one cosine over an output is "
            "dominated by its largest values, so a small-valued part of it (such as a "
            f"detector's scores beside its boxes) can be lost unseen; {LOW_FIDELITY_HINT}"
        ),
    ),
    FidelityWarning(
        "most samples lost",
        lambda out: (
            _cosine(out)
            and out.sample_cosine_mean is not None
            and out.sample_cosine_mean < LOW_FIDELITY
        ),
        lambda out: (
            f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
            f"over all held samples together, but at {out.sample_cosine_mean:.3f} per "
            f"sample on average (worst {out.worst_sample_cosine:.3f}, < {LOW_FIDELITY}): "
            "the samples with the largest outputs dominate one cosine over all of them, "
            f"and most others are lost; {LOW_FIDELITY_HINT}"
        ),
    ),
    FidelityWarning(
        "a few positions lost",
        lambda out: _cosine(out) and 0 < out.float_max_abs < out.max_abs_error,
        lambda out: (
            f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
            f"as a whole, but some value is off by {out.max_abs_error:.3g}, more than the "
            f"largest float value ({out.float_max_abs:.3g}): a few positions (a token, a "
            f"row, a frame) are lost while the rest hide them; {LOW_FIDELITY_HINT}"
        ),
    ),
    FidelityWarning(
        "top-1 changed",
        lambda out: out.top1_agreement is not None and out.top1_agreement < LOW_FIDELITY,
        lambda out: (
            f"output {out.name!r}: its largest class differs from the float model's in "
            f"{1 - (out.top1_agreement or 0.0):.1%} of its rows on the held batches (< "
            f"{LOW_FIDELITY:.0%} agree): {LOW_FIDELITY_HINT}"
        ),
    ),
    FidelityWarning(
        "integer output differs",
        lambda out: out.compared == "agreement" and out.cosine < 1.0,
        lambda out: (
            f"output {out.name!r} differs from the float model in "
            f"{1 - out.cosine:.1%} of its values on the held batches (integer output)"
        ),
    ),
)
