"""What the accuracy-recovery steps and bias correction add to the report, as typed records
(:class:`onnxq.report.section.Section`): their JSON entries and their summary lines."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from onnxq.recover.bias_correction import BiasCorrection, BiasCorrectionPass
from onnxq.recover.stages import Recovery, summary


@dataclass(frozen=True)
class RecoveryRecord:
    """What the recovery steps did, per step (JSON-ready, as :class:`Recovery` collected it);
    no step that ran: no entry and no line."""

    steps: MappingProxyType[str, Any]

    @classmethod
    def of(cls, recovery: Recovery | None) -> RecoveryRecord:
        """The record of ``recovery`` (None: the run had none)."""
        return cls(MappingProxyType(recovery.to_dict() if recovery is not None else {}))

    def to_dict(self) -> dict[str, Any]:
        """``{"recovery": {step: its record}}``, or nothing when no step ran."""
        return {"recovery": dict(self.steps)} if self.steps else {}

    def summary_lines(self) -> list[str]:
        """One line that names each step and what it changed."""
        return ["recovery: " + summary(dict(self.steps))] if self.steps else []


@dataclass(frozen=True)
class BiasCorrectionRecord:
    """The shifts bias correction removed, one per layer it corrected (none: it was off or
    skipped, and the report's list is empty)."""

    corrections: tuple[BiasCorrection, ...] = ()

    @classmethod
    def of(cls, run: BiasCorrectionPass | None) -> BiasCorrectionRecord:
        """The record of the pass ``run`` (None: it did not run)."""
        return cls(tuple(run.corrections) if run is not None else ())

    def to_dict(self) -> dict[str, Any]:
        """``{"bias_corrections": [...]}``, one entry per corrected layer (always present)."""
        return {"bias_corrections": [asdict(c) for c in self.corrections]}

    def summary_lines(self) -> list[str]:
        """How many channels were shifted back, and the largest shift."""
        if not self.corrections:
            return []
        channels = sum(c.corrected for c in self.corrections)
        largest = max(self.corrections, key=lambda c: c.max_shift)
        return [
            f"bias correction: {channels} channels of {len(self.corrections)} layers shifted "
            f"back (largest {largest.max_shift:.3g} in {largest.node})"
        ]
