"""What ``onnxq analyze`` shows: the quantized ops ranked by where the error jumps (their local
error: each alone quantized), the model outputs with their worst samples, and the table as
JSON or HTML."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from onnxq import ir
from onnxq.analyze.layer_error import LayerError


def jumps(layers: list[LayerError]) -> list[LayerError]:
    """The quantized ops, where the error jumps first: lowest local SQNR (then cosine)."""
    return sorted(
        (x for x in layers if x.quantized),
        key=lambda x: (
            x.local_sqnr_db if x.local_sqnr_db is not None else float("inf"),
            x.local_cosine if x.local_cosine is not None else 1.0,
            x.tensor,
        ),
    )


def _db(value: float | None) -> str:
    return "   exact" if value is None else f"{value:5.1f} dB"


def print_analysis(
    layers: list[LayerError],
    outputs: list[str],
    top: int,
    echo: Callable[[str], None] = print,
) -> None:
    """The ranking, each op's advice, and the outputs' whole and worst-sample agreement."""
    ranked = jumps(layers)
    echo(
        f"{len(layers)} tensors compared, {len(ranked)} quantized ops; where the error jumps "
        "(local: the op alone quantized, on the float model's inputs; accumulated: "
        "everything up to it quantized):"
    )
    for x in ranked[:top]:
        echo(
            f"  local {_db(x.local_sqnr_db)} cos {x.local_cosine:.6f} | accumulated "
            f"{_db(x.sqnr_db)} cos {x.cosine:.6f}  {x.op_type:<10} {x.producer} "
            f"(tensor {x.tensor})"
        )
        if x.advice:
            echo(f"      {x.advice}")
    by_name = {x.tensor: x for x in layers}
    for x in (by_name[name] for name in outputs if name in by_name):
        odd = (
            f"; {x.nonfinite_mismatches} values NaN/Inf in one model only"
            if x.nonfinite_mismatches
            else ""
        )
        worst = (
            f"; worst sample cosine {x.worst_sample_cosine:.6f} (samples "
            f"{', '.join(map(str, x.worst_samples))}, worst first)"
            if x.worst_sample_cosine is not None
            else ""
        )
        echo(
            f"output {x.tensor!r}: cosine {x.cosine:.6f}, SQNR {_db(x.sqnr_db).strip()}{worst}{odd}"
        )
    if ranked and ranked[0].advice:
        echo(f"helps most: {ranked[0].producer}: {ranked[0].advice}")


def write_analysis(path: str | Path, layers: list[LayerError]) -> None:
    """JSON, or an HTML table for a ``.html`` path (atomically)."""
    p = Path(path)
    if p.suffix.lower() in (".html", ".htm"):
        text = _html(layers)
    else:
        rows = [asdict(x) for x in layers]
        text = json.dumps({"layers": rows, "jumps": [x.tensor for x in jumps(layers)]}, indent=1)
        text += "\n"
    ir.atomic_write_bytes(p, text.encode("utf-8"))


def _html(layers: list[LayerError]) -> str:
    def cell(value: object) -> str:
        if value is None:
            return "<td></td>"
        if isinstance(value, float):
            return f"<td>{value:.6g}</td>"
        return f"<td>{html.escape(str(value))}</td>"

    fields = (
        "tensor",
        "producer",
        "op_type",
        "local_sqnr_db",
        "local_cosine",
        "sqnr_db",
        "cosine",
        "relative_error",
        "worst_sample_cosine",
        "nonfinite_mismatches",
        "advice",
    )
    head = "".join(f"<th>{f.replace('_', ' ')}</th>" for f in fields)
    rows = "".join("<tr>" + "".join(cell(getattr(x, f)) for f in fields) + "</tr>" for x in layers)
    return (
        "<!doctype html><meta charset='utf-8'><title>onnxq analyze</title>"
        f"<table border=1><tr>{head}</tr>{rows}</table>"
    )
