"""The quantize report as a web page: a summary first (ops and tensors in INT8, weight size
before and after, fidelity fused and unfused, warnings), then where Q/DQ sit along the graph,
then why the other ops stay float, and the full tables.

Everything comes from :class:`onnxq.report.compose.Report`; the page holds what the JSON report
holds, with nothing that changes from run to run (no timings, no dates), so the same inputs give the
same bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Protocol

from onnxq.backends.default_session import DefaultSessionView
from onnxq.backends.validate import OutputFidelity
from onnxq.ir.ops import WEIGHTED_OP_TYPES  # they carry INT8's speed-up (display only)
from onnxq.materialize.qdq import Placed
from onnxq.place.annotations import Decision
from onnxq.report.page import (
    ALERT_COLOR,
    FLOAT_COLOR,
    INT8_COLOR,
    Cell,
    cards,
    esc,
    graph_strip,
    legend,
    page,
    pre,
    stacked_bars,
    table,
)
from onnxq.report.section import Body


class Report(Protocol):
    """What the page reads of :class:`onnxq.report.compose.Report` (which imports this module)."""

    model: str
    backend: str
    decisions: list[Decision]
    placed: list[Placed]
    calibration_batches: int
    fidelity: list[OutputFidelity]
    fidelity_mode: str
    warnings: list[str]
    notes: list[str]
    default_session: DefaultSessionView | None
    weight_bytes: tuple[int, int] | None
    body: Body | None

    def summary(self, timing: bool = True) -> str: ...

    @property
    def quantized_ops(self) -> list[Decision]: ...

    @property
    def float_ops(self) -> list[Decision]: ...


def report_html(report: Report, d: dict[str, Any], reasons: dict[str, int]) -> str:
    """The report as one self-contained HTML page; ``d``: its JSON-ready dict, ``reasons``:
    its float ops' reasons with their counts.  A run whose quantized part is a body (weight-only)
    shows its summary and the body's tables instead."""
    if report.body is not None:
        return body_html(report, report.body, d)
    body = [
        f"<h1>onnxq report: {esc(report.model)}</h1>",
        f"<p class='sub'>backend {esc(report.backend)} · onnxq {esc(d['onnxq_version'])} · "
        f"{esc(_calibration(report))}</p>",
        cards(summary_cards(report)),
        _messages(report),
        "<h2>Fidelity against the float model</h2>",
        fidelity_table(report),
        "<h2>Where Q/DQ sit along the graph</h2>",
        "<p>Every op in graph order, left to right; hover for its name and its rule or reason.</p>",
        legend(
            [
                (INT8_COLOR, "INT8 (Q/DQ on its inputs)"),
                (ALERT_COLOR, f"float {'/'.join(WEIGHTED_OP_TYPES)}"),
                (FLOAT_COLOR, "other float op"),
            ]
        ),
        graph_strip(_cells(report)),
        "<h3>By op type</h3>",
        stacked_bars(_by_op_type(report)),
        "<h2>Why ops stay float</h2>",
        table(
            ["ops", "op type and reason"],
            [(n, line) for line, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))],
        )
        if report.float_ops
        else "<p>Every op is quantized.</p>",
        _details(d),
    ]
    return page(f"onnxq report: {report.model}", "".join(body))


def body_html(report: Report, body: Body, d: dict[str, Any]) -> str:
    """The page of a run whose quantized part is ``body``: its summary, the body's tables, the
    config."""
    config = json.dumps(d["config"], indent=1, sort_keys=True, default=str)
    return page(
        "onnxq report",
        f"<h1>onnxq {esc(body.mode)} report: {esc(report.model)}</h1>{pre(report.summary())}"
        f"{body.html()}<h2>Config</h2>{pre(config)}",
    )


def summary_cards(report: Report) -> list[tuple[str, str]]:
    """The summary's figures as (value, label) pairs, most important first."""
    decisions = report.decisions
    weighted = [x for x in decisions if x.op_type in WEIGHTED_OP_TYPES]
    items = [
        (
            f"{len(report.quantized_ops)} of {len(decisions)}",
            f"ops in INT8 ({_share(len(report.quantized_ops), len(decisions))})",
        ),
        (
            f"{sum(x.quantized for x in weighted)} of {len(weighted)}",
            f"{'/'.join(WEIGHTED_OP_TYPES)} in INT8",
        ),
        (str(len(report.placed)), "tensors with Q/DQ"),
    ]
    if report.weight_bytes is not None:
        before, after = report.weight_bytes
        items.append(
            (
                f"{_mb(before)} → {_mb(after)}",
                f"weights, float → quantized ({before / max(after, 1):.1f}x smaller)",
            )
        )
    for f in report.fidelity[:3]:
        if f.compared == "cosine":
            items.append((f"{f.cosine:.6f}", f"cosine of output {f.name!r}"))
        if f.top1_agreement is not None:
            items.append((f"{f.top1_agreement:.1%}", f"top-1 agreement of {f.name!r}"))
    items.append((str(len(report.warnings)), "warnings"))
    return items


def fidelity_table(report: Report) -> str:
    """Per output: the agreement with the float model with onnxruntime's Q/DQ fusion off (the
    graph's own arithmetic: what TensorRT computes) and on (int8 CPU kernels)."""
    fused_mode = report.fidelity_mode.startswith("onnxruntime, Q/DQ fused")
    fused_view = {}
    if report.default_session is not None:
        fused_view = {o.name: o for o in report.default_session.outputs}
    rows: list[list[Any]] = []
    for f in report.fidelity:
        if f.compared not in ("cosine", "agreement"):
            rows.append([f.name, f.compared, None, None, None, None])
            continue
        own = [f.cosine, f.top1_agreement]
        other: list[Any] = [None, None]
        view = fused_view.get(f.name)
        if view is not None:
            other = [view.fused, view.fused_top1]
        unfused, fused = (other, own) if fused_mode else (own, other)
        rows.append([f.name, f.compared, *unfused, *fused])
    if not rows:
        return "<p>Not measured (no held calibration batches or no float copy).</p>"
    note = (
        "<p>Held calibration batches, not used to set the ranges. Unfused: onnxruntime with "
        "fusion off, the Q/DQ graph's own arithmetic (what TensorRT computes); fused: "
        "onnxruntime's default session, Q/DQ fused into int8 CPU kernels. '-': not run.</p>"
    )
    header = ["output", "compared", "unfused", "unfused top-1", "fused", "fused top-1"]
    return note + table(header, rows)


def _messages(report: Report) -> str:
    warnings = "".join(f"<div class='warn'>warning: {esc(w)}</div>" for w in report.warnings)
    notes = "".join(f"<div class='ok'>note: {esc(n)}</div>" for n in report.notes)
    if not warnings:
        warnings = "<div class='ok'>No warnings.</div>"
    return warnings + notes


def _cells(report: Report) -> list[Cell]:
    cells = []
    for x in report.decisions:
        if x.quantized:
            color, why = INT8_COLOR, f"INT8 by rule {x.rule}"
        else:
            color = ALERT_COLOR if x.op_type in WEIGHTED_OP_TYPES else FLOAT_COLOR
            why = f"float: {x.reason}"
        cells.append(Cell(color, f"{x.node} ({x.op_type}) {why}"))
    return cells


def _by_op_type(report: Report) -> list[tuple[str, int, int]]:
    total = Counter(x.op_type for x in report.decisions)
    done = Counter(x.op_type for x in report.decisions if x.quantized)
    order = sorted(total, key=lambda op: (-done[op], -total[op], op))
    return [(op, done[op], total[op]) for op in order[:20]]


def _details(d: dict[str, Any]) -> str:
    sections = [
        (
            "Quantized tensors",
            ["tensor", "kind", "method", "scale", "zero_point", "axis", "range", "bound", "note"],
            d["quantized_tensors"],
        ),
        ("Quantized ops", ["node", "op_type", "rule", "tensors", "note"], d["quantized_ops"]),
        ("Float ops", ["node", "op_type", "reason", "closest_rule"], d["float_ops"]),
        ("Violations", ["node", "field", "expected", "got"], d["violations"]),
        (
            "Bias corrections",
            ["node", "bias", "channels", "corrected", "max_shift", "mean_abs_shift"],
            d.get("bias_corrections", []),
        ),
    ]
    out = ["<h2>Details</h2>"]
    for title, cols, rows in sections:
        if rows:
            out.append(
                f"<details><summary>{esc(title)} ({len(rows)})</summary>"
                + table(cols, [[_value(r.get(c)) for c in cols] for r in rows])
                + "</details>"
            )
    config = json.dumps(d["config"], indent=1, sort_keys=True, default=str)
    simplify = ", ".join(d["simplify_passes"]) or "none"
    out.append(f"<p>Simplify passes that fired: {esc(simplify)}</p>")
    out.append(f"<details><summary>Config</summary>{pre(config)}</details>")
    return "".join(out)


def _value(value: Any) -> Any:
    """A table cell: a long list of numbers by its first values, names all of them."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    if isinstance(value, list) and len(value) > 4:
        head = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value[:3])
        return f"[{head}, ... {len(value)} values]"
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value) + "]"
    return value


def _calibration(report: Report) -> str:
    if report.calibration_batches:
        return f"{report.calibration_batches} calibration batches"
    return "statistics from a calibration cache"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"
