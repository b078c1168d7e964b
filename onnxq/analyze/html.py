"""The ``analyze`` page: the error along the graph (inline SVG), the layers where it jumps with
a suggested action, and the histogram and chosen range of each one's quantized inputs.

It reads the analysis as rows of plain dicts (``dataclasses.asdict`` of each layer), in graph
order, with at least ``tensor``, ``producer``, ``op_type``, ``cosine`` and ``relative_error``;
other fields are shown in the full table, and two are used when present: ``local_sqnr_db``
(the op alone quantized: the ranking) and ``advice`` (the suggested action).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import onnx

from onnxq.analyze.ranges import ChosenRange, TensorRange, quantized_inputs, tensor_ranges
from onnxq.data.sources import Batch
from onnxq.report.page import ALERT_COLOR, INT8_COLOR, cards, esc, page, table

SQNR_CAP_DB = 80.0  # an exact tensor (no error) is drawn at the top of the plot
CLIPS = 0.001  # a range that clips more than this share of the values is too narrow
SPREAD = 8.0  # a range this many times wider than 99.9% of the values is set by outliers
SMALL_DB = 30.0  # an accumulated SQNR from here up is an error of at most ~3% of the signal
Row = dict[str, Any]


def sqnr_db(row: Row) -> float:
    """The tensor's accumulated signal-to-quantization-noise ratio in dB (capped)."""
    value = row.get("sqnr_db")
    if value is None:
        rel = row.get("relative_error") or 0.0
        value = -20 * math.log10(rel) if rel > 0 else SQNR_CAP_DB
    return min(float(value), SQNR_CAP_DB)


def worst_layers(
    rows: Sequence[Row], inputs: dict[str, list[ChosenRange]], top: int
) -> list[tuple[Row, float]]:
    """The ops where the error jumps most, worst first, each with the dB it loses there: the
    op's local SQNR when the rows have one (lower is worse), else how far the SQNR drops from
    its quantized inputs to its output.  Ops that lose nothing are not listed."""
    by_tensor = {r["tensor"]: r for r in rows}
    scored = []
    for row in rows:
        readers = inputs.get(row["producer"], [])
        if not readers and not row.get("quantized"):
            continue  # no quantization noise enters here
        local = row.get("local_sqnr_db")
        if local is not None:
            scored.append((row, SQNR_CAP_DB - min(float(local), SQNR_CAP_DB)))
            continue
        arriving = min(
            (sqnr_db(by_tensor[c.tensor]) for c in readers if c.tensor in by_tensor),
            default=SQNR_CAP_DB,
        )
        scored.append((row, arriving - sqnr_db(row)))
    scored.sort(key=lambda item: (-item[1], item[0]["tensor"]))
    return [item for item in scored if item[1] > 0][:top]


def suggested_action(row: Row, ranges: Sequence[TensorRange]) -> str:
    """What to try for this op: the analysis's own advice, else what its inputs' ranges say."""
    if row.get("advice"):
        return str(row["advice"])
    if sqnr_db(row) >= SMALL_DB:
        return (
            f"none needed: the error here is small ({sqnr_db(row):.0f} dB); act only if an "
            "output loses accuracy"
        )
    for r in ranges:
        if r.clipped > CLIPS:
            return (
                f"its input {r.tensor!r} has {r.clipped:.1%} of its values outside the chosen "
                f"range: widen it with --method-for '{r.tensor}=minmax'"
            )
    for r in ranges:
        if _bulk(r) * SPREAD < max(abs(r.low), abs(r.high)):
            return (
                f"a few outliers set the range of {r.tensor!r}, so most of its values get few "
                f"steps: try --method-for '{r.tensor}=percentile' (or mse)"
            )
    return f"keep it float: --exclude '{row['producer']}'"


def analysis_page(
    rows: Sequence[Row],
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    batches: Iterable[Batch],
    max_batches: int,
    title: str = "onnxq analyze",
    top: int = 5,
) -> str:
    """The page: measures the worst layers' input ranges on ``batches``, then renders."""
    inputs = quantized_inputs(quant_model)
    worst = worst_layers(rows, inputs, top)
    chosen = [c for row, _ in worst for c in inputs.get(row["producer"], [])]
    measured = {r.tensor: r for r in tensor_ranges(float_model, chosen, batches, max_batches)}
    ranges = {
        row["producer"]: [
            measured[c.tensor] for c in inputs.get(row["producer"], []) if c.tensor in measured
        ]
        for row, _ in worst
    }
    return render(rows, worst, ranges, title)


def render(
    rows: Sequence[Row],
    worst: Sequence[tuple[Row, float]],
    ranges: dict[str, list[TensorRange]],
    title: str,
) -> str:
    """The HTML page of an analysis (see :func:`analysis_page`)."""
    marked = {row["tensor"]: i + 1 for i, (row, _) in enumerate(worst)}
    body = [
        f"<h1>{esc(title)}</h1>",
        "<p class='sub'>Each tensor of the float model against its namesake in the quantized "
        "model, in graph order. SQNR: signal-to-quantization-noise ratio, higher is better "
        "(40 dB: error 1% of the signal; 20 dB: 10%).</p>",
        cards(
            [
                (str(len(rows)), "tensors compared"),
                (str(len(worst)), "layers marked"),
                *(
                    [(f"{sqnr_db(rows[-1]):.1f} dB", f"SQNR of {rows[-1]['tensor']!r} (last)")]
                    if rows
                    else []
                ),
            ]
        ),
        "<h2>Error along the graph</h2>",
        error_plot(rows, marked),
        "<h2>Where the error jumps</h2>",
        _worst_table(worst, ranges),
        "<h2>Inputs of the marked layers: values and chosen range</h2>",
        "".join(_inputs_section(marked[r["tensor"]], r, ranges) for r, _ in worst),
        "<details><summary>Every tensor</summary>",
        table(_columns(rows), [[_cell(r.get(c)) for c in _columns(rows)] for r in rows]),
        "</details>",
    ]
    return page(title, "".join(body))


def _worst_table(worst: Sequence[tuple[Row, float]], ranges: dict[str, list[TensorRange]]) -> str:
    if not worst:
        return "<p>No quantized op found in the analysis.</p>"
    header = ["#", "node", "op", "tensor", "SQNR dB", "lost here dB", "cosine", "suggested action"]
    rows = [
        [
            i + 1,
            r["producer"],
            r["op_type"],
            r["tensor"],
            round(sqnr_db(r), 2),
            round(lost, 2),
            r.get("cosine"),
            suggested_action(r, ranges.get(r["producer"], [])),
        ]
        for i, (r, lost) in enumerate(worst)
    ]
    return table(header, rows)


def _inputs_section(rank: int, row: Row, ranges: dict[str, list[TensorRange]]) -> str:
    plots = "".join(histogram(x) for x in ranges.get(row["producer"], []))
    return f"<h3>#{rank} {esc(row['producer'])}</h3>" + (
        plots or "<p>No per-tensor quantized activation input.</p>"
    )


def error_plot(rows: Sequence[Row], marked: dict[str, int], width: int = 1100) -> str:
    """SQNR (dB) of each tensor in graph order as a line, the marked layers in red."""
    height, left, bottom, top_pad = 260, 46, 24, 10
    n = max(len(rows) - 1, 1)
    plot_w, plot_h = width - left - 10, height - bottom - top_pad

    def xy(i: int, db: float) -> tuple[float, float]:
        return left + plot_w * i / n, top_pad + plot_h * (1 - db / SQNR_CAP_DB)

    points = [xy(i, sqnr_db(r)) for i, r in enumerate(rows)]
    parts = [f"<svg width='{width}' height='{height}' role='img' aria-label='SQNR along graph'>"]
    for db in range(0, int(SQNR_CAP_DB) + 1, 20):
        _, y = xy(0, db)
        parts.append(
            f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>"
            f"<text x='{left - 6}' y='{y + 4:.1f}' font-size='11' text-anchor='end'>{db} dB</text>"
        )
    parts.append(
        f"<polyline fill='none' stroke='{INT8_COLOR}' stroke-width='1.5' points='"
        + " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        + "'/>"
    )
    for (x, y), row in zip(points, rows, strict=True):
        label = f"{row['tensor']} ({row['op_type']}): {sqnr_db(row):.1f} dB"
        rank = marked.get(row["tensor"])
        color, radius = (ALERT_COLOR, 5) if rank else (INT8_COLOR, 2)
        parts.append(
            f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{radius}' fill='{color}'>"
            f"<title>{esc(label)}</title></circle>"
        )
        if rank:
            parts.append(f"<text x='{x + 6:.1f}' y='{y - 6:.1f}' font-size='12'>#{rank}</text>")
    parts.append(
        f"<text x='{left}' y='{height - 4}' font-size='11' fill='#666'>graph order: first "
        f"tensor → last ({len(rows)} tensors); hover a point for its name</text></svg>"
    )
    return "".join(parts)


def histogram(r: TensorRange, width: int = 520, height: int = 150) -> str:
    """The values' histogram (log counts), the chosen range shaded, what it clips said."""
    left, right = r.edges[0], r.edges[-1]
    span = (right - left) or 1.0
    peak = math.log1p(max(r.counts, default=1))
    bar_w = width / max(len(r.counts), 1)

    def x(value: float) -> float:
        return width * (value - left) / span

    parts = [
        f"<svg width='{width}' height='{height + 18}' role='img' aria-label='histogram'>",
        f"<rect x='{x(r.low):.1f}' y='0' width='{x(r.high) - x(r.low):.1f}' height='{height}' "
        "fill='#e8f0fb'/>",
    ]
    for i, count in enumerate(r.counts):
        h = height * math.log1p(count) / peak if peak else 0.0
        parts.append(
            f"<rect x='{i * bar_w:.1f}' y='{height - h:.1f}' width='{max(bar_w - 1, 1):.1f}' "
            f"height='{h:.1f}' fill='{INT8_COLOR}'/>"
        )
    for edge in (r.low, r.high):
        parts.append(
            f"<line x1='{x(edge):.1f}' x2='{x(edge):.1f}' y1='0' y2='{height}' "
            f"stroke='{ALERT_COLOR}' stroke-width='2'/>"
        )
    parts.append(
        f"<text x='0' y='{height + 14}' font-size='11'>{left:.4g}</text>"
        f"<text x='{width}' y='{height + 14}' font-size='11' text-anchor='end'>{right:.4g}</text>"
        "</svg>"
    )
    caption = (
        f"<p><b>{esc(r.tensor)}</b>: values {r.observed_min:.4g} to {r.observed_max:.4g}; chosen "
        f"range {r.low:.4g} to {r.high:.4g} (shaded, red lines); {r.clipped:.2%} of the values "
        "fall outside it. Counts on a log scale.</p>"
    )
    return caption + "".join(parts)


def _bulk(r: TensorRange) -> float:
    """The |value| under which 99.9% of the histogram's values lie (at bin resolution)."""
    total = sum(r.counts)
    if not total:
        return 0.0
    centers = [(a + b) / 2 for a, b in zip(r.edges, r.edges[1:], strict=False)]
    order = sorted(range(len(centers)), key=lambda i: abs(centers[i]))
    seen = 0
    for i in order:
        seen += r.counts[i]
        if seen >= 0.999 * total:
            return abs(centers[i]) + (r.edges[1] - r.edges[0]) / 2
    return max(abs(r.edges[0]), abs(r.edges[-1]))


def _columns(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k in r))


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return value
