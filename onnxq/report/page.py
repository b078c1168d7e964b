"""Building blocks of onnxq's self-contained HTML pages (the quantize report, ``analyze``):
one stylesheet, tables, and inline SVG charts.  No scripts and no network access: a page opens
from a file, offline, and prints.  Every text is escaped here, so callers pass plain strings.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.5em auto;max-width:1200px;
 padding:0 1em;color:#1d1d1f;line-height:1.4}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;
 border-bottom:1px solid #ddd;padding-bottom:.2em}
.sub{color:#666;margin-top:0}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:8px;padding:.6em .9em;min-width:11em;background:#fafafa}
.card .v{font-size:1.5em;font-weight:600}.card .k{color:#555;font-size:.85em}
.warn{background:#fff6e0;border-left:4px solid #e0a000;padding:.5em .9em;margin:.4em 0}
.ok{background:#eaf7ea;border-left:4px solid #3a3;padding:.5em .9em;margin:.4em 0}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums}
details{margin:.5em 0}summary{cursor:pointer;font-weight:600}
svg text{font-family:system-ui,sans-serif}
"""

INT8_COLOR = "#2f7ed8"
FLOAT_COLOR = "#c8c8c8"
ALERT_COLOR = "#e8743b"


def esc(text: object) -> str:
    """``text`` as HTML-escaped text."""
    return html.escape(str(text))


def pre(text: str) -> str:
    """Preformatted text (quotes left as they are: they need no escaping there)."""
    return f"<pre>{html.escape(text, quote=False)}</pre>"


def page(title: str, body: str) -> str:
    """A complete HTML document."""
    return (
        f"<!doctype html><html lang='en'><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style><body>{body}</body></html>\n"
    )


def cards(items: Sequence[tuple[str, str]]) -> str:
    """A row of summary cards, each (value, label)."""
    inner = "".join(
        f"<div class='card'><div class='v'>{esc(v)}</div><div class='k'>{esc(k)}</div></div>"
        for v, k in items
    )
    return f"<div class='cards'>{inner}</div>"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table; numbers are right-aligned, None shows as '-'."""

    def cell(value: object) -> str:
        if value is None:
            return "<td>-</td>"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"<td>{esc(value)}</td>"
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        return f"<td class='n'>{text}</td>"

    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


@dataclass(frozen=True)
class Cell:
    """One op in a graph strip: its color and its tooltip."""

    color: str
    tooltip: str


def graph_strip(cells: Sequence[Cell], per_row: int = 80) -> str:
    """The ops in graph order as a grid of squares, left to right and row by row, each with
    a tooltip: where in the graph the model is quantized (larger squares for a small graph)."""
    size = 22 if len(cells) <= per_row // 2 else 11
    per_row = per_row // 2 if size == 22 else per_row
    rows = max(1, -(-len(cells) // per_row))
    width, height = per_row * size + 40, rows * size + 4
    parts = [f"<svg width='{width}' height='{height}' role='img' aria-label='ops in graph order'>"]
    for row in range(rows):
        parts.append(
            f"<text x='0' y='{row * size + size - 2}' font-size='10' fill='#888'>"
            f"{row * per_row}</text>"
        )
    for i, c in enumerate(cells):
        x, y = 36 + (i % per_row) * size, (i // per_row) * size + 2
        parts.append(
            f"<rect x='{x}' y='{y}' width='{size - 2}' height='{size - 2}' fill='{c.color}'>"
            f"<title>{esc(c.tooltip)}</title></rect>"
        )
    parts.append("</svg>")
    return "".join(parts)


def legend(items: Sequence[tuple[str, str]]) -> str:
    """Colored swatches with labels, (color, label)."""
    return " ".join(
        f"<span style='display:inline-block;width:.9em;height:.9em;background:{c};"
        f"vertical-align:middle'></span> {esc(label)}&nbsp;&nbsp;"
        for c, label in items
    )


def stacked_bars(rows: Sequence[tuple[str, int, int]], width: int = 420) -> str:
    """Horizontal bars, one per (label, in INT8, total): how much of each op type is INT8."""
    top = max((t for _, _, t in rows), default=1) or 1
    bar_h, label_w = 16, 150
    parts = [
        f"<svg width='{label_w + width + 90}' "
        f"height='{len(rows) * (bar_h + 4) + 4}' role='img' aria-label='ops in INT8 by type'>"
    ]
    for i, (label, done, total) in enumerate(rows):
        y = i * (bar_h + 4) + 2
        w_total, w_done = width * total / top, width * done / top
        parts.append(
            f"<text x='{label_w - 6}' y='{y + 12}' font-size='12' text-anchor='end'>"
            f"{esc(label)}</text>"
            f"<rect x='{label_w}' y='{y}' width='{w_total:.1f}' height='{bar_h}' "
            f"fill='{FLOAT_COLOR}'/><rect x='{label_w}' y='{y}' width='{w_done:.1f}' "
            f"height='{bar_h}' fill='{INT8_COLOR}'/>"
            f"<text x='{label_w + w_total + 6:.1f}' y='{y + 12}' font-size='12'>"
            f"{done} / {total}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
