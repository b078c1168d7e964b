"""The report of a weight-only run: per layer its format, algorithm and output error, the
weighted ops left float and why, and the fidelity of the model's outputs."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from onnxq.report.compose import Report, _finite
from onnxq.weightonly.messages import weight_only_messages
from onnxq.weightonly.outcome import LayerRecord, WeightOnlyOutcome


def weight_only_report(outcome: WeightOnlyOutcome) -> WeightOnlyReport:
    """The report of a weight-only run: its layers, what stayed float, its fidelity, and its
    messages."""
    o = outcome
    said = weight_only_messages(o)
    return WeightOnlyReport(
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
        layers=o.records,
        skipped=[(s.node, s.op_type, s.reason) for s in o.skipped],
        weight_bytes=o.weight_bytes,
    )


@dataclass
class WeightOnlyReport(Report):
    """A :class:`~onnxq.report.compose.Report` whose quantized part is a list of layers."""

    layers: list[LayerRecord] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # node, op type, reason
    weight_bytes: tuple[int, int] = (0, 0)  # float bytes of the quantized weights, stored bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        from onnxq.version import __version__

        return {
            "onnxq_version": __version__,
            "model": self.model,
            "backend": self.backend,
            "mode": "weight-only",
            "config": self.config,
            "simplify_passes": self.simplify_passes,
            "summary": {
                "layers": len(self.layers),
                "left_float": len(self.skipped),
                "calibration_batches": self.calibration_batches,
                "weight_bytes_float": self.weight_bytes[0],
                "weight_bytes_stored": self.weight_bytes[1],
            },
            "layers": [asdict(r) for r in self.layers],
            "left_float": [
                {"node": n, "op_type": op, "reason": why} for n, op, why in self.skipped
            ],
            "fidelity": {"mode": self.fidelity_mode, "outputs": [asdict(f) for f in self.fidelity]},
            "violations": [asdict(v) for v in self.violations],
            "notes": self.notes,
            "warnings": self.warnings,
        }

    def summary(self, timing: bool = True) -> str:
        """A few readable lines for the terminal (``timing``: as :meth:`Report.summary`; a
        weight-only run times nothing)."""
        formats: dict[str, int] = {}
        for r in self.layers:
            key = f"{r.format}, {r.algorithm}"
            formats[key] = formats.get(key, 0) + 1
        before, after = self.weight_bytes
        lines = [
            f"backend {self.backend}, weight-only: {len(self.layers)} layers quantized, "
            f"{len(self.skipped)} left float; weights {before / 2**20:.1f} MB -> "
            f"{after / 2**20:.1f} MB"
            + (
                f"; {self.calibration_batches} calibration batches"
                if self.calibration_batches
                else ""
            )
        ]
        lines += [f"  {count:4d} x {key}" for key, count in sorted(formats.items())]
        errors = sorted(
            (r for r in self.layers if r.error is not None), key=lambda r: -(r.error or 0)
        )
        if errors:
            worst = ", ".join(f"{r.node} {r.error:.3g}" for r in errors[:3])
            lines.append(f"largest relative output errors: {worst}")
        for r in self.layers:
            if r.why != "default":
                lines.append(f"  {r.node}: {r.format} ({r.why})")
        reasons: dict[str, int] = {}
        for _, op, why in self.skipped:
            reasons[f"{op}: {why}"] = reasons.get(f"{op}: {why}", 0) + 1
        if reasons:
            lines.append("left float:")
            lines += [
                f"  {n:4d} x {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:12]
            ]
        for f in self.fidelity:
            if f.compared == "cosine":
                lines.append(
                    f"fidelity {f.name}: cosine {f.cosine:.6f}, max abs error "
                    f"{f.max_abs_error:.4g} (float range {f.float_max_abs:.4g})"
                    + (
                        ""
                        if f.top1_agreement is None
                        else f", top-1 agreement {f.top1_agreement:.2%}"
                    )
                )
            else:
                lines.append(f"fidelity {f.name}: {f.compared}")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)

    def to_html(self) -> str:
        """A self-contained HTML page: the summary and the per-layer table."""
        esc = html.escape

        def cell(v: object) -> str:
            text = "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            return f"<td>{esc(text)}</td>"

        rows = "".join(
            "<tr>"
            + "".join(cell(v) for v in (r.node, r.op_type, r.format, r.algorithm, r.error, r.why))
            + "</tr>"
            for r in self.layers
        )
        head = "".join(
            f"<th>{c}</th>" for c in ("node", "op", "format", "algorithm", "error", "why")
        )
        return (
            "<!doctype html><meta charset='utf-8'><title>onnxq report</title>"
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}"
            "table{border-collapse:collapse}</style>"
            f"<h1>onnxq weight-only report: {esc(self.model)}</h1><pre>{esc(self.summary())}</pre>"
            f"<h2>Layers</h2><table><tr>{head}</tr>{rows}</table><h2>Config</h2><pre>"
            + esc(json.dumps(_finite(self.config), indent=1, sort_keys=True, default=str))
            + "</pre>"
        )
