"""The quantize report's HTML page: the summary it opens with, the graph strip, the reasons."""

from __future__ import annotations

import re

import onnxq
from onnxq.backends.default_session import DefaultSessionView, FusedFidelity
from onnxq.backends.validate import OutputFidelity
from onnxq.place.annotations import Decision
from onnxq.report.compose import Report
from onnxq.report.html import fidelity_table, summary_cards
from tests import graphs

UNFUSED = "onnxruntime, fusion off: the Q/DQ graph's own arithmetic"
FUSED = "onnxruntime, Q/DQ fused into int8 kernels"


def _report(**extra) -> Report:
    decisions = [
        Decision("conv1", "Conv", False, "weighted_op", "Conv with 1 input channel"),
        Decision("conv2", "Conv", True, "weighted_op", "", ("x", "w")),
        Decision("relu", "Relu", False, "", "no rule quantizes Relu"),
        Decision("fc", "Gemm", True, "weighted_op", "", ("h", "fw")),
    ]
    fields = {
        "decisions": decisions,
        "fidelity": [OutputFidelity("logits", 0.9991, 0.1, 4.0, top1_agreement=0.984)],
        "fidelity_mode": UNFUSED,
        "weight_bytes": (1_200_000, 310_000),
        "warnings": ["output 'logits' <check it>"],
        **extra,
    }
    return Report("m.onnx", "tensorrt", {}, **fields)


def test_summary_cards_count_ops_weighted_ops_size_fidelity_and_warnings():
    cards = dict((label, value) for value, label in summary_cards(_report()))
    assert cards["ops in INT8 (50%)"] == "2 of 4"
    assert cards["Conv/ConvTranspose/Gemm/MatMul in INT8"] == "2 of 3"
    assert cards["weights, float → quantized (3.9x smaller)"] == "1.20 MB → 0.31 MB"
    assert cards["cosine of output 'logits'"] == "0.999100"
    assert cards["top-1 agreement of 'logits'"] == "98.4%"
    assert cards["warnings"] == "1"


def test_page_opens_with_the_summary_then_warnings_then_the_graph():
    page = _report().to_html()
    order = [
        page.index("ops in INT8"),
        page.index("warning: output &#x27;logits&#x27; &lt;check it&gt;"),
        page.index("Fidelity against the float model"),
        page.index("Where Q/DQ sit along the graph"),
        page.index("Why ops stay float"),
    ]
    assert order == sorted(order)


def test_graph_strip_has_one_square_per_op_in_graph_order_with_its_reason():
    page = _report().to_html()
    strip = page[page.index("aria-label='ops in graph order'") :]
    titles = re.findall(r"<rect [^>]*><title>([^<]*)</title>", strip)
    assert titles == [
        "conv1 (Conv) float: Conv with 1 input channel",
        "conv2 (Conv) INT8 by rule weighted_op",
        "relu (Relu) float: no rule quantizes Relu",
        "fc (Gemm) INT8 by rule weighted_op",
    ]


def test_fidelity_shows_unfused_and_the_default_sessions_fused_figures():
    view = DefaultSessionView(
        "x86-vnni", (FusedFidelity("logits", "cosine", 0.9991, 0.97, 0.984, 0.9),)
    )
    text = fidelity_table(_report(default_session=view))
    row = text[text.index("<td>logits</td>") :]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)[:6]
    assert cells == ["logits", "cosine", "0.9991", "0.984", "0.97", "0.9"]


def test_fidelity_of_a_fused_backend_fills_the_fused_columns():
    text = fidelity_table(_report(fidelity_mode=FUSED))
    row = text[text.index("<td>logits</td>") :]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)[:6]
    assert cells == ["logits", "cosine", "-", "-", "0.9991", "0.984"]


def test_every_reason_is_on_the_page_and_none_points_elsewhere():
    decisions = [Decision(f"op{i}", f"Op{i}", False, "", f"reason {i}") for i in range(15)]
    report = _report(decisions=decisions)
    assert "more reasons in the report file" in report.summary()
    page = report.to_html()
    assert "more reasons" not in page
    assert all(f"Op{i}: reason {i}" in page for i in range(15))


def test_a_quantized_models_report_records_its_weight_bytes():
    model = graphs.conv_relu()
    result = onnxq.quantize(model, graphs.random_batches(model, 2), progress=False)
    sizes = result.report.to_dict()["summary"]["weight_bytes"]
    weight = next(t for t in model.graph.initializer if len(t.dims) == 4)
    count = 1
    for d in weight.dims:
        count *= d
    assert sizes["float"] == 4 * (count + 16)  # float32 weight and bias
    # int8 weight, plus its 16 scales and zero points, the bias and the activation's qparams
    assert count < sizes["quantized"] < count + 200
