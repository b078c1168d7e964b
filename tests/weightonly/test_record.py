"""The weight-only layers as the report shows them (``onnxq.weightonly.record``)."""

from __future__ import annotations

from onnxq.weightonly.outcome import LayerRecord
from onnxq.weightonly.record import WeightOnlyLayers

LAYERS = (
    LayerRecord("q_proj", "MatMul", "q.w", "int4 b128", "gptq", "default", 0.0123),
    LayerRecord("k_proj", "MatMul", "k.w", "int4 b128", "gptq", "default", 0.0456),
    LayerRecord("lm_head", "MatMul", "h.w", "int8 b128", "rtn", "the head", None),
)
SKIPPED = (
    ("gate", "Gemm", "excluded by --exclude gate"),
    ("up", "Gemm", "excluded by --exclude gate"),
)


def test_figures_headline_and_json_entries():
    record = WeightOnlyLayers(LAYERS, SKIPPED)
    assert record.mode == "weight-only"
    assert record.figures() == {"layers": 3, "left_float": 2}
    assert record.headline() == "3 layers quantized, 2 left float"
    d = record.to_dict()
    assert list(d) == ["layers", "left_float"]
    assert d["layers"][2] == {
        "node": "lm_head",
        "op_type": "MatMul",
        "weight": "h.w",
        "format": "int8 b128",
        "algorithm": "rtn",
        "why": "the head",
        "error": None,
        "note": "",
    }
    assert d["left_float"][0] == {
        "node": "gate",
        "op_type": "Gemm",
        "reason": "excluded by --exclude gate",
    }


def test_summary_lines_count_formats_and_name_the_worst_and_the_promoted():
    assert WeightOnlyLayers(LAYERS, SKIPPED).summary_lines() == [
        "     2 x int4 b128, gptq",
        "     1 x int8 b128, rtn",
        "largest relative output errors: k_proj 0.0456, q_proj 0.0123",
        "  lm_head: int8 b128 (the head)",
        "left float:",
        "     2 x Gemm: excluded by --exclude gate",
    ]
    assert WeightOnlyLayers(()).summary_lines() == []


def test_html_table_shows_errors_short_and_missing_ones_as_a_dash():
    html = WeightOnlyLayers(LAYERS).html()
    assert html.startswith("<h2>Layers</h2><table>")
    assert "<td>0.0123</td>" in html and "<td>-</td>" in html
    assert html.count("<tr>") == 1 + len(LAYERS)
