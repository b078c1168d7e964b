"""The report: what was quantized (with qparams and observer), what was not and why, fidelity.

The same inputs give the same bytes: no timestamps, no absolute paths, lists in graph order.
"""

from __future__ import annotations

import json
import math
import os
import re
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
from onnxq.recover.bias_correction import BiasCorrection
from onnxq.report.fidelity import latency_warning


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
    bias_corrections: list[BiasCorrection] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)  # onnxq.recover's steps, JSON-ready
    # a model validated unfused, run in onnxruntime's default (fused) session on this machine
    default_session: DefaultSessionView | None = None
    # the accuracy target's search (onnxq.mixed.search.MixedPrecision.to_dict); None: none
    mixed_precision: dict[str, Any] | None = None
    # initializer bytes of the float model (after simplify) and of the quantized one
    weight_bytes: tuple[int, int] | None = None

    # -- views ---------------------------------------------------------------------------
    @property
    def quantized_ops(self) -> list[Decision]:
        """Nodes that got Q/DQ."""
        return [d for d in self.decisions if d.quantized]

    @property
    def float_ops(self) -> list[Decision]:
        """Nodes left float, each with its reason."""
        return [d for d in self.decisions if not d.quantized]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
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
            "bias_corrections": [asdict(c) for c in self.bias_corrections],
            **(
                {"mixed_precision": self.mixed_precision}
                if self.mixed_precision is not None
                else {}
            ),
            **({"recovery": self.recovery} if self.recovery else {}),
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
        if self.bias_corrections:
            channels = sum(c.corrected for c in self.bias_corrections)
            largest = max(self.bias_corrections, key=lambda c: c.max_shift)
            lines.append(
                f"bias correction: {channels} channels of {len(self.bias_corrections)} "
                f"layers shifted back (largest {largest.max_shift:.3g} in "
                f"{largest.node})"
            )
        if self.mixed_precision is not None:
            from onnxq.mixed.search import summary_lines

            lines.extend(summary_lines(self.mixed_precision))
        if self.recovery:
            from onnxq.recover.stages import summary

            lines.append("recovery: " + summary(self.recovery))
        for f in self.fidelity:
            if f.selected_by:
                lines.append(
                    f"fidelity {f.name}: rows selected by {f.selected_by}, compared "
                    "by position (other detections or another order count as "
                    "differences): " + f.difference()
                )
            elif f.compared == "cosine":
                top1 = (
                    "" if f.top1_agreement is None else f", top-1 agreement {f.top1_agreement:.2%}"
                ) + (
                    ""
                    if f.threshold_agreement is None
                    else f", {f.threshold_agreement:.2%} on the same side of {f.threshold:g}"
                )
                worst = (
                    ""
                    if f.worst_slice_cosine is None
                    else f", worst of {f.slices} slices along axis {f.slice_axis}: cosine "
                    f"{f.worst_slice_cosine:.6f} (index {f.worst_slice})"
                )
                padded = (
                    ""
                    if not f.padding_left_out
                    else f", {f.padding_left_out} padded positions (mask 0) left out"
                )
                # shown when a few samples dominate the whole cosine
                per_sample = (
                    ""
                    if f.sample_cosine_mean is None or f.sample_cosine_mean >= f.cosine - 0.01
                    else f", per sample {f.sample_cosine_mean:.6f} on average (worst "
                    f"{f.worst_sample_cosine:.6f}"
                    + (
                        f", held samples {', '.join(map(str, f.worst_samples))}"
                        if f.worst_samples
                        else ""
                    )
                    + ")"
                )
                lines.append(
                    f"fidelity {f.name} ({self.fidelity_mode}): cosine {f.cosine:.6f}, "
                    f"max abs error {f.max_abs_error:.4g} (float range "
                    f"{f.float_max_abs:.4g}){top1}{worst}{padded}{per_sample}"
                )
            elif f.compared == "agreement":
                lines.append(
                    f"fidelity {f.name} ({self.fidelity_mode}): equal to the float "
                    f"model's in {f.cosine:.1%} of its values on the held batches"
                )
            else:
                lines.append(f"fidelity {f.name}: {f.compared}")
        if self.default_session is not None:
            lines.extend(_default_session_lines(self.default_session, timing))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)

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


def _default_session_lines(view: DefaultSessionView, timing: bool) -> list[str]:
    """The default session's figures that differ beyond noise and, with ``timing``, its latency
    (and the warning when it is slower than float: said here, once, not in the report file)."""
    lines = [
        f"fidelity {o.name} (onnxruntime's default session on this {view.cpu} machine, "
        f"Q/DQ fused): {o.compared} {o.fused:.6f}, against {o.unfused:.6f} unfused"
        for o in view.outputs
        if o.beyond_noise
    ]
    if timing and view.latency is not None:
        lines.append(
            f"latency in onnxruntime's default session on this {view.cpu} machine (one "
            f"thread, median of {view.latency.pairs}): {view.latency.quantized_ms:.3g} ms, "
            f"float {view.latency.float_ms:.3g} ms"
        )
        slower = latency_warning(view.cpu, view.latency)
        if slower is not None:
            lines.append(f"warning: {slower}")
    return lines


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


_QUOTED = re.compile(r"'[^']*'")
NAME_LIMIT = 60  # a quoted name longer than this is shown by its start and its end


def reason_lines(float_ops: list[Decision]) -> dict[str, int]:
    """One line per op type and reason -> its count.  Reasons that differ only in the names
    they quote (a tensor, a node) share a line, which shows the first op's names and says how
    many more there are: a line per op would bury the reasons."""
    groups: dict[str, list[str]] = {}
    for d in float_ops:
        generic = _QUOTED.sub("''", d.reason)
        groups.setdefault(f"{d.op_type}: {generic}", []).append(d.reason)
    lines: dict[str, int] = {}
    for key, texts in groups.items():
        op_type = key.split(":", 1)[0]
        line = f"{op_type}: {_QUOTED.sub(_short_name, texts[0])}"
        others = len(texts) - 1
        if len(set(texts)) > 1:
            line += f" (and {others} more with other names)"
        lines[line] = len(texts)
    return lines


def _short_name(quoted: re.Match[str]) -> str:
    """A quoted name, shortened past :data:`NAME_LIMIT` to its start and its end (the end of
    an exported name, ``.../MatMul_output_0``, is its most specific part)."""
    name = quoted.group(0)[1:-1]
    if len(name) <= NAME_LIMIT:
        return quoted.group(0)
    return f"'{name[:24]}…{name[-(NAME_LIMIT - 25) :]}'"


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
