"""The report's warnings and notes, built from the stage results by one pure function.

:func:`messages`, the one entry point, reads an :class:`Outcome` (what each stage of a Q/DQ run
returned) or a :class:`LayerwiseOutcome` (a weight-only run's) and says in words what deserves
a warning (something the user should check or fix) or a note (a choice onnxq made).
Nothing here runs a model or parses a message: each sentence comes from data, and is built
from data about the model (its inputs' kinds, its ops), not from fixed assumptions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.calibrate.engine import CalibrationResult
from onnxq.calibrate.ranges import RangeRemark
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.placement import PlacementOptions
from onnxq.config.recipes import ActivationRecipe, WeightOnlyRecipe
from onnxq.data.inputs import InputSpec, input_kind
from onnxq.errors import InternalError, OnnxqError
from onnxq.materialize.precision_record import PrecisionSplit
from onnxq.materialize.qdq import Placed
from onnxq.mixed.record import MixedPrecision
from onnxq.place.annotations import Annotations
from onnxq.prepare.stage import Prepared
from onnxq.recover.bias_correction import BiasCorrectionPass
from onnxq.recover.stages import Recovery
from onnxq.report.fidelity import verification_messages
from onnxq.report.hints import recovery_out_of_reach, score_map_hint
from onnxq.validate.verify import Verification

MIN_SAMPLES = 32  # calibration samples below which the report warns that ranges may not cover
# what helps calibration cover the inputs, per kind of input (onnxq.data.inputs.input_kind)
SAMPLE_HINTS = {
    "image": "several crops or scales of each image help",
    "audio": "clips of several speakers, levels and noise, or windows cut from longer "
    "recordings, help",
    "tokens": "texts of the lengths and topics the model will meet help",
}


@dataclass(frozen=True)
class GraphView:
    """What the messages read of the graph as placement saw it (materialize edits the graph
    afterwards): its nodes and tensors, in its If/Loop/Scan bodies too."""

    nodes: tuple[tuple[str, str], ...]  # (name, op type)
    tensors: frozenset[str]

    @classmethod
    def of(cls, graph: ir.Graph, profile: BackendProfile) -> GraphView:
        """The view of ``graph`` and its If/Loop/Scan bodies (``profile``: the run's)."""
        scoped = [(scope, n) for scope in ir.scopes(graph) for n in scope.nodes]
        return cls(
            tuple((n.name, n.op_type) for _, n in scoped),
            frozenset(t for _, n in scoped for t in (*n.input, *n.output) if t),
        )


@dataclass(frozen=True)
class Outcome:
    """What the stages of one run returned, as far as the messages need it."""

    config: ActivationRecipe
    profile: BackendProfile
    profile_note: str  # why the profile's weights lose precision (7-bit weights)
    prepared: Prepared
    graph: GraphView  # the simplified graph placement saw
    inputs: list[InputSpec]
    annotations: Annotations
    statistics: CalibrationResult
    remarks: tuple[RangeRemark, ...]
    bias: BiasCorrectionPass | None
    placed: list[Placed]  # the tensors that got Q/DQ
    verification: Verification
    mixed_precision: MixedPrecision | None = None  # the accuracy target's search
    recovery: Recovery | None = None  # what the accuracy-recovery steps did
    precision: PrecisionSplit | None = None  # what the float compute is written in


class LayerwiseOutcome(Protocol):
    """What the messages read of a run that quantizes the weights layer by layer, with no
    Q/DQ placement (the weight-only run: :class:`onnxq.weightonly.outcome.WeightOnlyOutcome`)."""

    @property
    def config(self) -> WeightOnlyRecipe: ...

    @property
    def prepared(self) -> Prepared: ...

    @property
    def graph(self) -> GraphView: ...

    @property
    def verification(self) -> Verification: ...

    @property
    def calibration_batches(self) -> int:
        """0: no calibration data, so no fidelity measured."""
        ...

    def notes(self) -> list[str]:
        """What its layers have to say (shared weights, short blocks, the kernels' level)."""
        ...


@dataclass(frozen=True)
class Messages:
    """The report's warnings and notes, in order."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def messages(outcome: Outcome | LayerwiseOutcome) -> Messages:
    """Every warning and note of a run, in the order the report lists them."""
    if not isinstance(outcome, Outcome):
        return layerwise_messages(outcome)
    o = outcome
    fidelity_warnings, fidelity_notes = verification_messages(o.verification)
    warnings = [
        *([o.profile_note] if o.profile_note else []),
        *range_warnings(o.remarks),
        *unmatched_patterns(o.graph, o.config.placement),
        *few_samples(o.statistics, o.inputs),
        *weight_inputs(o.prepared.weight_inputs),
        *bias_correction_skipped(o.bias),
        *(o.recovery.warnings if o.recovery is not None else []),
        *recovery_out_of_reach(o.recovery, o.bias, o.annotations, o.prepared.model),
        *nothing_quantized(len(o.placed), o.profile),
        *fidelity_warnings,
        *score_map_hint(o.config.placement.method, o.annotations, o.verification),
        *(o.mixed_precision.warnings() if o.mixed_precision is not None else []),
    ]
    notes = [
        *load_notes(o.prepared),
        *(o.recovery.notes if o.recovery is not None else []),
        *o.annotations.notes,
        *profile_notes(o.profile),
        *budget_note(o.statistics, o.config.calibration),
        *fidelity_notes,
    ]
    return Messages(warnings, notes)


def layerwise_messages(outcome: LayerwiseOutcome) -> Messages:
    """The warnings and notes of a weight-only run: the sentences about loading, patterns and
    fidelity that every run has, and its layers' notes."""
    o = outcome
    if not o.calibration_batches:
        fidelity_warnings: list[str] = []
        fidelity_notes = [
            "fidelity not measured: no calibration data (--calib) to run both models on"
        ]
    else:
        fidelity_warnings, fidelity_notes = verification_messages(o.verification)
    warnings = [
        *unmatched_patterns(o.graph, o.config.placement),
        *weight_inputs(o.prepared.weight_inputs),
        *fidelity_warnings,
    ]
    return Messages(warnings, [*load_notes(o.prepared), *o.notes(), *fidelity_notes])


def opset_conversion_hint(upgrade: ir.OpsetUpgrade) -> str:
    """What to add to an onnxruntime failure on a model whose opset onnxq converted."""
    return (
        f"the model's opset {upgrade.from_opset} was converted to {upgrade.to_opset} before "
        "onnxruntime ran it: if the original runs, the conversion is at fault; re-export the "
        f"model with opset >= {upgrade.to_opset}"
    )


@contextlib.contextmanager
def blame_conversion(upgrade: ir.OpsetUpgrade | None) -> Iterator[None]:
    """Note on an onnxruntime failure that the model ran only after onnxq converted its opset:
    onnx's version converter may be what broke it."""
    try:
        yield
    except (OnnxqError, InternalError) as exc:
        if upgrade is not None and exc.onnxruntime_failed:
            exc.add_note(opset_conversion_hint(upgrade))
        raise


# ------------------------------------------------------------------------------ preparing
def load_notes(prepared: Prepared) -> list[str]:
    """What loading and preparing changed in the model."""
    notes = []
    if prepared.load.sorted_nodes:
        notes.append(
            "the model's nodes were not in topological order (ONNX requires it; "
            "onnxruntime sorts them itself): onnxq sorted them"
        )
    if prepared.load.widened:
        kinds = " and ".join(prepared.load.widened)
        notes.append(
            f"the model computes in {kinds}: onnxq calibrated and quantized its FP32 form (the "
            "same values, widened) and wrote the float compute back in the run's "
            "high_precision; its inputs and outputs keep their types"
        )
    if (up := prepared.load.opset_upgrade) is not None:
        notes.append(
            f"the model's opset {up.from_opset} was converted to {up.to_opset} "
            f"({ir.opset_purpose(up.to_opset)} needs it): the output is an opset-{up.to_opset} "
            "model"
        )
    if (ir_ := prepared.ir_downgrade) is not None:
        notes.append(
            f"the model's IR version {ir_.from_ir} is newer than onnxruntime {ir_.onnxruntime} "
            f"reads ({ir_.to_ir}); it uses nothing those versions added, so onnxq calibrated "
            f"it and wrote the output as IR {ir_.to_ir}"
        )
    return notes


DYNAMIC_NOTE = (
    "dynamic quantization: weights int8 per output channel, stored ahead of time; "
    "activations quantized per tensor to uint8 by onnxruntime's kernels on each run "
    "(DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM), so no calibration "
    "data was needed"
)


def profile_notes(profile: BackendProfile) -> list[str]:
    """What the run's profile means for its output: dynamic quantization, and how to check
    the output in onnxruntime where its default session computes it wrong (FP8)."""
    return [
        *([DYNAMIC_NOTE] if profile.dynamic else []),
        *([profile.validation_note] if profile.validation_note else []),
    ]


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


def unmatched_patterns(graph: GraphView, options: PlacementOptions) -> list[str]:
    """A warning for each exclude pattern or override that matches nothing in the model."""
    return [
        f"{what} matches no node or tensor of the model (after simplification; "
        "`onnxq explain MODEL` lists the node names): it changes nothing"
        for what in options.unmatched(list(graph.nodes), set(graph.tensors))
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
