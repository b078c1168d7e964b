"""The report: what was quantized (with qparams and observer), what was not and why, fidelity.

The features that add to it (bias correction, the accuracy target's search, recovery; a
weight-only run's layers as its body) hand it typed records (:mod:`onnxq.report.section`),
which it writes in the order given: it never imports a feature to format it.  The same inputs
give the same bytes: no timestamps, no absolute paths, lists in graph order.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxq.backends.default_session import DefaultSessionView
from onnxq.backends.target import describe_target
from onnxq.backends.validate import OutputFidelity
from onnxq.errors import Violation
from onnxq.materialize.qdq import Placed
from onnxq.place.annotations import Decision
from onnxq.report.lines import (
    brief_fidelity_lines,
    default_session_lines,
    fidelity_lines,
    reason_lines,
)
from onnxq.report.section import Body, Section


@dataclass
class Report:
    """Everything a user needs to trust (or debug) a quantized model."""

    model: str
    backend: str
    config: dict[str, Any]
    # the CPU class an onnxruntime output is tuned for (onnxq.backends.target.target_record)
    target_cpu: dict[str, Any] = field(default_factory=dict)
    simplify_passes: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    placed: list[Placed] = field(default_factory=list)
    calibration_batches: int = 0
    fidelity: list[OutputFidelity] = field(default_factory=list)
    fidelity_mode: str = ""
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # model-wide choices worth knowing
    # the features' records (bias correction, the accuracy target's search, recovery), in the
    # order the JSON report and the summary show them (onnxq.report.section)
    sections: list[Section] = field(default_factory=list)
    # a model validated unfused, run in onnxruntime's default (fused) session on this machine
    default_session: DefaultSessionView | None = None
    # initializer bytes of the float model (after simplify) and of the quantized one; in a
    # weight-only run, the quantized weights' float bytes and their stored bytes
    weight_bytes: tuple[int, int] | None = None
    # the quantized part of a run that does not place Q/DQ op by op (weight-only): shown
    # instead of the decisions and the tensors with Q/DQ
    body: Body | None = None

    # -- views ---------------------------------------------------------------------------
    @property
    def quantized_ops(self) -> list[Decision]:
        """Nodes that got Q/DQ."""
        return [d for d in self.decisions if d.quantized]

    @property
    def float_ops(self) -> list[Decision]:
        """Nodes left float, each with its reason."""
        return [d for d in self.decisions if not d.quantized]

    def entries(self) -> dict[str, Any]:
        """The JSON entries of the body and the sections, in order."""
        out: dict[str, Any] = {}
        for section in [*([self.body] if self.body is not None else []), *self.sections]:
            out.update(section.to_dict())
        return out

    @property
    def mixed_precision(self) -> dict[str, Any] | None:
        """The accuracy target's search as the JSON report holds it; None: no search."""
        entry: dict[str, Any] | None = self.entries().get("mixed_precision")
        return entry

    @property
    def recovery(self) -> dict[str, Any]:
        """The recovery steps' records as the JSON report holds them (empty: none ran)."""
        entry: dict[str, Any] = self.entries().get("recovery", {})
        return entry

    @property
    def bias_corrections(self) -> list[Any]:
        """The shifts bias correction removed, one record per layer (the ``corrections`` its
        section carries)."""
        return [c for s in self.sections for c in getattr(s, "corrections", ())]

    @property
    def layers(self) -> list[Any]:
        """A weight-only run's layers, one record each (other runs: none)."""
        return list(self.body.layers) if self.body is not None else []

    @property
    def skipped(self) -> list[tuple[str, str, str]]:
        """A weight-only run's weighted ops left float: (node, op type, reason)."""
        return list(self.body.skipped) if self.body is not None else []

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        if self.body is not None:
            return self._body_dict(self.body)
        from onnxq.version import __version__

        return {
            "onnxq_version": __version__,
            "model": self.model,
            "backend": self.backend,
            **({"target_cpu": self.target_cpu} if self.target_cpu else {}),
            "config": self.config,
            "simplify_passes": self.simplify_passes,
            "summary": {
                "ops": len(self.decisions),
                "quantized_ops": len(self.quantized_ops),
                "float_ops": len(self.float_ops),
                "quantized_tensors": len(self.placed),
                "calibration_batches": self.calibration_batches,
                **(
                    {
                        "weight_bytes": dict(
                            zip(("float", "quantized"), self.weight_bytes, strict=True)
                        )
                    }
                    if self.weight_bytes is not None
                    else {}
                ),
            },
            "quantized_tensors": [_placed(p) for p in self.placed],
            "quantized_ops": [
                {
                    "node": d.node,
                    "op_type": d.op_type,
                    "rule": d.rule,
                    "tensors": list(d.tensors),
                    **({"note": d.reason} if d.reason else {}),
                }
                for d in self.quantized_ops
            ],
            "float_ops": [
                {
                    "node": d.node,
                    "op_type": d.op_type,
                    "reason": d.reason,
                    **({"closest_rule": d.rule} if d.rule else {}),
                }
                for d in self.float_ops
            ],
            **self.entries(),
            "fidelity": {
                "mode": self.fidelity_mode,
                "outputs": [asdict(f, dict_factory=_listed) for f in self.fidelity],
                **(
                    {"onnxruntime_default_session": self.default_session.to_dict()}
                    if self.default_session is not None
                    else {}
                ),
            },
            "violations": [asdict(v) for v in self.violations],
            "notes": self.notes,
            "warnings": self.warnings,
        }

    def _body_dict(self, body: Body) -> dict[str, Any]:
        """The JSON-ready dict of a run whose quantized part is ``body`` (weight-only)."""
        from onnxq.version import __version__

        before, after = self.weight_bytes or (0, 0)
        return {
            "onnxq_version": __version__,
            "model": self.model,
            "backend": self.backend,
            "mode": body.mode,
            "config": self.config,
            "simplify_passes": self.simplify_passes,
            "summary": {
                **body.figures(),
                "calibration_batches": self.calibration_batches,
                "weight_bytes_float": before,
                "weight_bytes_stored": after,
            },
            **self.entries(),
            "fidelity": {"mode": self.fidelity_mode, "outputs": [asdict(f) for f in self.fidelity]},
            "violations": [asdict(v) for v in self.violations],
            "notes": self.notes,
            "warnings": self.warnings,
        }

    def to_json(self) -> str:
        """Deterministic JSON text; a NaN or infinite number (a range or an error the data made
        non-finite) is written as null, which JSON can hold."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False) + "\n"

    def _headline(self) -> str:
        """The summary's first line: the backend (and a precision other than int8), the ops
        and tensors quantized, and where the ranges came from."""
        precision = self.config.get("precision", "int8")
        head = f"backend {self.backend}" + (f" ({precision})" if precision != "int8" else "")
        head += f": {len(self.quantized_ops)} of {len(self.decisions)} ops quantized"
        if any(p.runtime for p in self.placed):
            return (
                f"{head}, {len(self.placed)} tensors quantized (activations at run time: "
                "dynamic quantization, no calibration)"
            )
        source = (
            f"{self.calibration_batches} calibration batches"
            if self.calibration_batches
            else "statistics from a calibration cache"
        )
        return f"{head}, {len(self.placed)} tensors with Q/DQ, {source}"

    def summary(self, timing: bool = True) -> str:
        """A few readable lines for the terminal; ``timing``: with the latency measured in
        onnxruntime's default session (it changes from run to run, so the report file, and
        the HTML page, leave it out)."""
        if self.body is not None:
            return "\n".join(self._body_summary(self.body))
        lines = [
            self._headline(),
            *([describe_target(self.target_cpu)] if self.target_cpu else []),
        ]
        reasons = reason_lines(self.float_ops)
        if reasons:
            lines.append("left float:")
            for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:12]:
                lines.append(f"  {count:4d} x {reason}")
            if len(reasons) > 12:
                lines.append(f"  ... {len(reasons) - 12} more reasons in the report file")
        for section in self.sections:
            lines.extend(section.summary_lines())
        lines.extend(fidelity_lines(self.fidelity, self.fidelity_mode))
        if self.default_session is not None:
            lines.extend(default_session_lines(self.default_session, timing))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)

    def _body_summary(self, body: Body) -> list[str]:
        """The summary of a run whose quantized part is ``body``: the weight sizes, the body's
        lines and the sections', and fidelity in short (the run times nothing)."""
        before, after = self.weight_bytes or (0, 0)
        lines = [
            f"backend {self.backend}, {body.mode}: {body.headline()}; weights "
            f"{before / 2**20:.1f} MB -> {after / 2**20:.1f} MB"
            + (
                f"; {self.calibration_batches} calibration batches"
                if self.calibration_batches
                else ""
            ),
            *body.summary_lines(),
        ]
        for section in self.sections:
            lines.extend(section.summary_lines())
        lines.extend(brief_fidelity_lines(self.fidelity))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"warning: {w}" for w in self.warnings)
        return lines

    def to_html(self) -> str:
        """A self-contained HTML page: summary, Q/DQ along the graph, reasons, tables."""
        from onnxq.report.html import report_html

        return report_html(self, _finite(self.to_dict()), reason_lines(self.float_ops))

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON, or HTML for a ``.html`` path (atomically)."""
        from onnxq.ir import atomic_write_bytes

        p = Path(path)
        text = self.to_html() if p.suffix.lower() in (".html", ".htm") else self.to_json()
        atomic_write_bytes(p, text.encode("utf-8"))


def _placed(p: Placed) -> dict[str, Any]:
    qp = p.qparams
    scale = np.asarray(qp.scale, dtype=np.float64)
    zp = np.asarray(qp.zero_point)
    out: dict[str, Any] = {
        "tensor": p.tensor,
        "kind": p.kind,
        "method": qp.method,
        "dtype": p.dtype,
        "scale": float(scale) if scale.ndim == 0 else [float(s) for s in scale.ravel()],
        "zero_point": _zero_points(zp),
        "axis": qp.axis,
        "range": [float(qp.low), float(qp.high)],
        "consumers": [f"{n}:{i}" for n, i in p.consumers],
        "bits": p.bits,
    }
    if p.runtime:  # a dynamic kernel computes scale and zero point on each run
        out.update(scale=None, zero_point=None, range=None, runtime=True)
    if qp.note:
        out["note"] = qp.note
    if qp.bound:
        out["bound"] = qp.bound
    return out


def _zero_points(zp: np.ndarray) -> int | float | list[int | float]:
    """A zero point as JSON: one number, or the distinct values of a per-channel one."""
    kind = int if zp.dtype.kind in "iu" else float  # FP8 zero points are floats
    if zp.ndim == 0:
        return kind(zp)
    return sorted({kind(z) for z in zp.ravel()})


def _finite(value: Any) -> Any:
    """``value`` with every NaN/Inf float (in nested dicts and lists) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _listed(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """``asdict`` with tuples as lists (what JSON gives back)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in items}
