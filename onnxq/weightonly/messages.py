"""The warnings and notes of a weight-only run, built from its stage results by one pure
function (the weight-only counterpart of :func:`onnxq.report.messages.messages`, whose sentences
about loading, patterns and fidelity it reuses).
"""

from __future__ import annotations

from onnxq.report.fidelity import verification_messages
from onnxq.report.messages import Messages, load_notes, unmatched_patterns, weight_inputs
from onnxq.weightonly.outcome import SharedWeight, WeightOnlyOutcome
from onnxq.weightonly.targets import Layer


def weight_only_messages(outcome: WeightOnlyOutcome) -> Messages:
    """Every warning and note of a weight-only run, in the order the report lists them."""
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
    notes = [
        *load_notes(o.prepared),
        *shared_weights(o.shared),
        *short_blocks(o.layers),
        *accuracy_level(o.accuracy_level),
        *fidelity_notes,
    ]
    return Messages(warnings, notes)


def shared_weights(shared: list[SharedWeight]) -> list[str]:
    """A note per weight that several layers read."""
    return [
        f"weight {s.weight!r} is read by {len(s.readers)} layers ({', '.join(s.readers)}): "
        f"stored once as {s.fmt.describe()}, rounded to nearest (no single input to calibrate "
        "it against)"
        for s in shared
    ]


def short_blocks(layers: list[Layer]) -> list[str]:
    """Layers whose input size the block size does not divide."""
    short = [x.node for x in layers if x.fmt.block_size and x.k % x.fmt.block_size]
    if not short:
        return []
    return [
        f"{len(short)} layer(s) have an input size that the block size does not divide "
        f"(first: {short[0]}): their last block is shorter (padded with zeros in the file)"
    ]


def accuracy_level(level: int | None) -> list[str]:
    """Which MatMulNBits accuracy level the output asks onnxruntime for."""
    if level is None:
        return []
    return [
        f"MatMulNBits accuracy_level {level}"
        + (": onnxruntime computes with int8-quantized activations" if level == 4 else "")
    ]
