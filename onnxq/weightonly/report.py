"""The report of a weight-only run: a :class:`~onnxq.report.compose.Report` whose quantized part
is the run's :class:`~onnxq.weightonly.record.WeightOnlyLayers` (per layer its format, algorithm
and output error, the weighted ops left float and why), with the fidelity of its outputs."""

from __future__ import annotations

from onnxq.report.compose import Report
from onnxq.report.messages import messages
from onnxq.weightonly.outcome import WeightOnlyOutcome
from onnxq.weightonly.record import WeightOnlyLayers


def weight_only_report(outcome: WeightOnlyOutcome) -> Report:
    """The report of a weight-only run: its layers, what stayed float, its fidelity, and its
    messages; its ``config`` is the recipe's fields (:meth:`WeightOnlyRecipe.to_dict`)."""
    o = outcome
    said = messages(o)
    return Report(
        model=o.prepared.source.name if o.prepared.source else "<in-memory model>",
        backend=o.profile.name,
        config=o.config.to_dict(),
        simplify_passes=o.prepared.passes,
        calibration_batches=o.calibration_batches,
        fidelity=o.verification.fidelity,
        fidelity_mode=o.verification.mode,
        warnings=said.warnings,
        notes=said.notes,
        default_session=o.verification.default_session,
        weight_bytes=o.weight_bytes,
        body=WeightOnlyLayers(
            tuple(o.records), tuple((s.node, s.op_type, s.reason) for s in o.skipped)
        ),
    )
