"""The weight-only layers as the report shows them: :class:`WeightOnlyLayers`, the quantized
part of a weight-only run (an :class:`onnxq.report.section.Body`): per layer its format,
algorithm and output error, and the weighted ops left float with their reasons."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from onnxq.report.page import table
from onnxq.weightonly.outcome import LayerRecord

COLUMNS = ("node", "op", "format", "algorithm", "error", "why")


@dataclass(frozen=True)
class WeightOnlyLayers:
    """The layers a weight-only run quantized, and the weighted ops it left float."""

    layers: tuple[LayerRecord, ...]
    skipped: tuple[tuple[str, str, str], ...] = ()  # node, op type, reason
    mode: str = "weight-only"

    def figures(self) -> dict[str, int]:
        """The counts of the JSON report's summary."""
        return {"layers": len(self.layers), "left_float": len(self.skipped)}

    def headline(self) -> str:
        """The summary's count of layers quantized and left float."""
        return f"{len(self.layers)} layers quantized, {len(self.skipped)} left float"

    def to_dict(self) -> dict[str, Any]:
        """The JSON report's ``layers`` and ``left_float``."""
        return {
            "layers": [asdict(r) for r in self.layers],
            "left_float": [
                {"node": n, "op_type": op, "reason": why} for n, op, why in self.skipped
            ],
        }

    def summary_lines(self) -> list[str]:
        """Layers per format and algorithm, the largest output errors, the layers whose format
        is not the default (and why), and the reasons for the ops left float."""
        formats: dict[str, int] = {}
        for r in self.layers:
            key = f"{r.format}, {r.algorithm}"
            formats[key] = formats.get(key, 0) + 1
        lines = [f"  {count:4d} x {key}" for key, count in sorted(formats.items())]
        errors = sorted(
            (r for r in self.layers if r.error is not None), key=lambda r: -(r.error or 0)
        )
        if errors:
            worst = ", ".join(f"{r.node} {r.error:.3g}" for r in errors[:3])
            lines.append(f"largest relative output errors: {worst}")
        lines += [f"  {r.node}: {r.format} ({r.why})" for r in self.layers if r.why != "default"]
        reasons: dict[str, int] = {}
        for _, op, why in self.skipped:
            reasons[f"{op}: {why}"] = reasons.get(f"{op}: {why}", 0) + 1
        if reasons:
            lines.append("left float:")
            lines += [
                f"  {n:4d} x {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:12]
            ]
        return lines

    def html(self) -> str:
        """The page's table of layers (errors to 4 significant digits, '-' without data)."""
        rows = [
            [
                "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else v)
                for v in (r.node, r.op_type, r.format, r.algorithm, r.error, r.why)
            ]
            for r in self.layers
        ]
        return "<h2>Layers</h2>" + table(COLUMNS, rows)
