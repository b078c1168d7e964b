"""What the fidelity check found, in words: warnings about outputs that disagree with the float
model, notes about what the comparison left out, and what onnxruntime's default session showed
for a model validated unfused.  :data:`FIDELITY_WARNINGS` is the decision table: the first entry
that applies to an output gives its warning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnxq.backends.cpu import CPU_CLASSES
from onnxq.backends.default_session import DefaultSessionView, FusedFidelity, Latency
from onnxq.backends.output_metrics import DOMINATED
from onnxq.backends.validate import OutputFidelity
from onnxq.validate.verify import Verification

LOW_FIDELITY = 0.95  # output cosine (or top-1 agreement) below which the report warns
LOW_FIDELITY_HINT = (
    "check it on your metric; `onnxq analyze` ranks the tensors that lose "
    "most, and --exclude keeps their ops float"
)
WORST_SAMPLE = 0.9  # a sample's output cosine below which a user sees it degraded
THRESHOLD_AGREEMENT = 0.98  # a sigmoid output flipping more values at its threshold warns
SLOWER = 1.1  # the default session "runs slower" from this ratio on (timing noise below it)
CPU_DEPLOYMENT = "to deploy on a CPU with onnxruntime, quantize with --backend onnxruntime"
# why a run may hold no batches for the fidelity check (``Verification.unmeasured``)
UNHELD = {
    "no batches held": "statistics from a calibration cache without --calib data",
    "no batches held (dynamic)": "--dynamic without --calib data",
}


def verification_messages(verification: Verification) -> tuple[list[str], list[str]]:
    """(warnings, notes) about the quantized model's fidelity."""
    if verification.unmeasured in UNHELD:
        return [], [
            "fidelity not measured: no batches were held for it "
            f"({UNHELD[verification.unmeasured]}, or fidelity_batches: 0)"
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
    warnings.extend(default_session_warnings(verification.default_session))
    return warnings, notes


def default_session_warnings(view: DefaultSessionView | None) -> list[str]:
    """What onnxruntime's default session on this machine showed, when it could not run the
    model or its outputs differ beyond noise from what the Q/DQ graph computes."""
    if view is None:
        return []
    where = f"onnxruntime's default session on this machine ({view.cpu})"
    if view.failure is not None:
        return [
            f"{where}, which fuses Q/DQ into int8 kernels, cannot run this model, though its "
            f"Q/DQ graph runs: {view.failure}; {CPU_DEPLOYMENT}"
        ]
    differing = [o for o in view.outputs if o.beyond_noise]
    if not differing:
        return []
    figures = "; ".join(
        f"{o.name!r}: {_figure(o, fused=False)} unfused, {_figure(o, fused=True)} fused"
        for o in differing
    )
    why = (
        "without int8 dot products (VNNI) those add pairs of products in int16 sums, which "
        "signed int8 activations (run shifted to uint8) overflow"
        if CPU_CLASSES[view.cpu].int16_pair_sums
        else "those round and requantize between ops where the Q/DQ graph computes in float"
    )
    return [
        f"in {where} this model's outputs differ from the float model's more than the Q/DQ "
        f"graph's own arithmetic (what TensorRT computes) does ({figures}): onnxruntime fuses "
        f"the Q/DQ into int8 CPU kernels, and {why}; {CPU_DEPLOYMENT}"
    ]


def latency_warning(cpu: str, latency: Latency | None) -> str | None:
    """Said once, outside the report file (timings change from run to run): the model runs
    slower than the float one in onnxruntime's default session on this machine."""
    if latency is None or latency.ratio < SLOWER:
        return None
    return (
        f"in onnxruntime's default session on this machine ({cpu}) this model runs "
        f"{latency.ratio:.2f}x slower than the float model ({latency.quantized_ms:.3g} ms "
        f"against {latency.float_ms:.3g} ms per held batch, one thread, median of "
        f"{latency.pairs}): its Q/DQ placement is TensorRT's, and onnxruntime runs the ops "
        f"without a QuantizeLinear after them in float behind a DequantizeLinear; {CPU_DEPLOYMENT}"
    )


def _figure(out: FusedFidelity, fused: bool) -> str:
    value, top1 = (out.fused, out.fused_top1) if fused else (out.unfused, out.unfused_top1)
    text = f"cosine {value:.3f}" if out.compared == "cosine" else f"{value:.1%} equal"
    return text + (f" (top-1 agreement {top1:.0%})" if top1 is not None else "")


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
        lambda out: out.shape_changed,
        lambda out: (
            f"output {out.name!r}: {out.why_not_compared} on the held "
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
        "worst samples lost",
        lambda out: (
            _cosine(out)
            and out.worst_sample_cosine is not None
            and out.worst_sample_cosine < WORST_SAMPLE
        ),
        lambda out: (
            f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
            f"over all held samples ({out.sample_cosine_mean:.3f} per sample on average), "
            f"but its worst sample only at {out.worst_sample_cosine:.3f} (< {WORST_SAMPLE}; "
            f"held samples {', '.join(map(str, out.worst_samples))}, worst first, counted "
            "in calibration order): a user sees such samples degraded; "
            f"{LOW_FIDELITY_HINT}"
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
        "threshold flips",
        lambda out: (
            out.threshold_agreement is not None and out.threshold_agreement < THRESHOLD_AGREEMENT
        ),
        lambda out: (
            f"output {out.name!r} (a sigmoid) agrees with the float model at cosine "
            f"{out.cosine:.3f}, but {1 - (out.threshold_agreement or 0.0):.1%} of its values "
            f"fall on the other side of {out.threshold:g} on the held batches (set the "
            f"threshold you use with agreement_threshold): {LOW_FIDELITY_HINT}"
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
