"""What the ``--target`` search chose, as the pipeline returns it and the report shows it: the
:class:`MixedPrecision` result (:mod:`onnxq.mixed.search` makes it), the report summary's lines
of its JSON form (:func:`summary_lines`), and :class:`SearchRecord`, its part of the report
(an :class:`onnxq.report.section.Section`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import onnx

from onnxq.mixed.sensitivity import LayerSensitivity
from onnxq.numerics.accuracy_target import AccuracyTarget
from onnxq.place.loop import Placement


@dataclass(frozen=True)
class MixedPrecision:
    """What the search chose and why: the target, the held-out data, the all-INT8 score and
    the chosen model's, the kept layers (with their sensitivity and cost), the whole ranking,
    the number of trials, and the settled placement that keeps the chosen layers float."""

    target: AccuracyTarget
    heldout: str
    int8_score: float
    score: float
    kept: tuple[LayerSensitivity, ...]
    ranking: tuple[LayerSensitivity, ...]
    trials: int
    placement: Placement[Any]
    # multiply-adds per sample of every Conv/ConvTranspose/Gemm/MatMul of the model, and of
    # those the final placement leaves float for any reason (None: a shape is not static)
    model_macs: int | None = None
    model_float_macs: int | None = None
    # what the search minimised (onnxq.mixed.float_cost): "layers", or "macs" (multiply-adds float)
    cost: str = "layers"
    # the most of the model's multiply-adds the search could leave float (onnxq.mixed.float_budget;
    # None: any), and why it could not be applied (None: it was, or there was none)
    max_float_macs: float | None = None
    ceiling_note: str | None = None
    # ``score`` is the written model's once :meth:`as_written` measured it (after the run's
    # recovery steps, which the search's trials do not run); this is then the trial's
    search_score: float | None = None
    # runs that scored the choice with the statistics the run writes it with
    # (onnxq.mixed.confirm; 0: the trials' statistics are those)
    confirmations: int = 0
    rescore: Callable[[onnx.ModelProto], float] | None = field(
        default=None, repr=False, compare=False
    )

    def as_written(self, model: onnx.ModelProto) -> MixedPrecision:
        """This result with ``score`` measured on ``model``, the model as the run writes it
        (its ranges and weights after the recovery steps), on the held-out batches; the
        search's own score of its choice becomes ``search_score``."""
        if self.rescore is None:
            return self
        return replace(self, score=self.rescore(model), search_score=self.score, rescore=None)

    @property
    def met(self) -> bool:
        """True if the chosen model meets the target on the held-out batches."""
        return self.target.met(self.score)

    def float_macs(self) -> tuple[int | None, int | None]:
        """(multiply-adds per sample kept float, of all candidate layers); None: unknown."""
        kept = [s.macs for s in self.kept]
        every = [s.macs for s in self.ranking]
        if any(m is None for m in every):
            return None, None
        return sum(m for m in kept if m is not None), sum(m for m in every if m is not None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the report."""
        kept, total = self.float_macs()
        return {
            "target": self.target.describe(),
            "met": self.met,
            "heldout": self.heldout,
            "int8_score": _num(self.int8_score),
            "score": _num(self.score),
            "search_score": None if self.search_score is None else _num(self.search_score),
            "cost": self.cost,
            "kept_float": [_with_share(s, self.model_macs) for s in self.kept],
            "float_macs": kept,
            "candidate_macs": total,
            "float_macs_fraction": round(kept / total, 6) if kept is not None and total else None,
            "model_macs": self.model_macs,
            "model_float_macs": self.model_float_macs,
            "model_float_macs_fraction": (
                round(self.model_float_macs / self.model_macs, 6)
                if self.model_float_macs is not None and self.model_macs
                else None
            ),
            "max_float_macs_fraction": self.max_float_macs,
            "trials": self.trials,
            "confirmations": self.confirmations,
            "sensitivity": [s.to_dict() for s in self.ranking],
        }

    def warnings(self) -> list[str]:
        """The warnings of a missed target and of a ceiling that could not be applied."""
        said = [self.ceiling_note] if self.ceiling_note else []
        if self.met:
            return said
        within, hint = "", "more float layers by hand (--exclude), another --method"
        if self.max_float_macs is not None and not self.ceiling_note:
            within = f" within the ceiling of {self.max_float_macs:.1%} of its multiply-adds"
            hint = "a higher --target-max-float-macs, recovery (docs/recovery.md)"
        return [
            *said,
            f"accuracy target {self.target.describe()} not met on the held-out batches: the "
            f"best model found{within} scores {self.score:.6g} (all INT8: "
            f"{self.int8_score:.6g}) with {len(self.kept)} layer(s) float; it was written "
            f"anyway. Try {hint}, or a lower target",
        ]


@dataclass(frozen=True)
class SearchRecord:
    """The search's part of the report: its JSON form (:meth:`MixedPrecision.to_dict`, taken
    once the written model was scored)."""

    record: MappingProxyType[str, Any]

    @classmethod
    def of(cls, result: MixedPrecision) -> SearchRecord:
        """The record of the search ``result``."""
        return cls(MappingProxyType(result.to_dict()))

    def to_dict(self) -> dict[str, Any]:
        """``{"mixed_precision": the search's record}``."""
        return {"mixed_precision": dict(self.record)}

    def summary_lines(self) -> list[str]:
        """The target, whether it was met, and the layers kept float (:func:`summary_lines`)."""
        return summary_lines(dict(self.record))


def _with_share(layer: LayerSensitivity, model_macs: int | None) -> dict[str, Any]:
    """The layer's record with its share of the model's multiply-adds (None: unknown)."""
    share = layer.macs / model_macs if layer.macs is not None and model_macs else None
    return {**layer.to_dict(), "macs_share": None if share is None else round(share, 6)}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The report summary's lines for a search record (:meth:`MixedPrecision.to_dict`)."""
    kept = record["kept_float"]
    share = record["model_float_macs_fraction"]
    macs = "" if share is None else f"; {share:.1%} of the model's multiply-adds are float"
    if record.get("max_float_macs_fraction") is not None:
        macs += f" (ceiling {record['max_float_macs_fraction']:.1%})"
    lines = [
        f"accuracy target {record['target']} "
        + ("met" if record["met"] else "NOT met")
        + f" on {record['heldout']}: {_shown(record['score'])} (all INT8: "
        f"{_shown(record['int8_score'])}{_trial(record)}), "
        f"{len(kept)} layer(s) kept float{macs}, {record['trials']} trials"
    ]
    for layer in kept[:12]:
        cost = "" if layer["macs"] is None else f", {layer['macs']:,} MACs"
        if layer.get("macs_share") is not None:
            cost += f" ({layer['macs_share']:.2%} of the model)"
        lines.append(f"  float: {layer['node']} ({layer['op_type']}) gain {layer['gain']}{cost}")
    if len(kept) > 12:
        lines.append(f"  ... {len(kept) - 12} more in the report file")
    return lines


def _trial(record: dict[str, Any]) -> str:
    """The search's own score of the written choice, where the written model's differs (the
    recovery steps the trials do not run)."""
    searched = record.get("search_score")
    if searched is None or searched == record["score"]:
        return ""
    return f"; the search's trial: {_shown(searched)}"


def _shown(value: float | None) -> str:
    """A score of the record; None is an infinite one (sqnr of equal outputs)."""
    return "exact (inf)" if value is None else f"{value:g}"


def _num(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


__all__ = ["MixedPrecision", "SearchRecord", "summary_lines"]
