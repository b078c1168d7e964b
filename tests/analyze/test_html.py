"""The ``analyze`` page: ranking, suggested actions, histograms, and the page end to end."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from onnxq.analyze.html import render, sqnr_db, suggested_action, worst_layers
from onnxq.analyze.ranges import ChosenRange, TensorRange, quantized_inputs, tensor_ranges
from onnxq.cli import main
from tests import graphs


def _row(tensor: str, producer: str, rel: float, **extra) -> dict:
    return {
        "tensor": tensor,
        "producer": producer,
        "op_type": "Conv",
        "cosine": 1 - rel**2 / 2,
        "relative_error": rel,
        **extra,
    }


def _range(values: np.ndarray, low: float, high: float) -> TensorRange:
    counts, edges = np.histogram(values, bins=64, range=(min(values.min(), low), high))
    clipped = float(((values < low) | (values > high)).mean())
    return TensorRange(
        "t",
        low,
        high,
        float(values.min()),
        float(values.max()),
        tuple(edges),
        tuple(counts),
        clipped,
    )


def test_sqnr_comes_from_the_relative_error_and_is_capped():
    assert sqnr_db(_row("a", "n", 0.01)) == pytest.approx(40.0)
    assert sqnr_db(_row("a", "n", 0.0)) == 80.0
    assert sqnr_db(_row("a", "n", 0.5, sqnr_db=12.5)) == 12.5  # the analysis's own figure wins


def test_worst_layers_rank_by_the_drop_from_their_quantized_inputs():
    rows = [
        _row("a", "conv_a", 0.001),  # 60 dB
        _row("b", "conv_b", 0.01),  # 40 dB, reads a: loses 20 dB
        _row("c", "relu", 0.011),  # float op: no noise enters here
        _row("d", "conv_d", 0.1),  # 20 dB, reads c (~39 dB): loses ~19 dB
    ]
    inputs = {
        "conv_b": [ChosenRange("a", -1, 1)],
        "conv_d": [ChosenRange("c", -1, 1)],
        "conv_a": [ChosenRange("x", -1, 1)],  # a graph input: arrives exact (80 dB)
    }
    ranked = [(r["producer"], round(lost, 1)) for r, lost in worst_layers(rows, inputs, 5)]
    assert ranked == [("conv_a", 20.0), ("conv_b", 20.0), ("conv_d", 19.2)]
    assert [r["producer"] for r, _ in worst_layers(rows, inputs, 1)] == ["conv_a"]


def test_worst_layers_use_the_local_error_when_the_analysis_has_it():
    rows = [
        _row("a", "conv_a", 0.1, local_sqnr_db=50.0, quantized=True),
        _row("b", "conv_b", 0.2, local_sqnr_db=25.0, quantized=True),
        _row("c", "relu", 0.2, local_sqnr_db=None, quantized=False),
    ]
    assert [r["producer"] for r, _ in worst_layers(rows, {}, 5)] == ["conv_b", "conv_a"]


def test_suggested_action_follows_the_data():
    rng = np.random.default_rng(0)
    values = rng.normal(size=20000)
    row = _row("out", "conv", 0.1)
    assert "--method-for 't=minmax'" in suggested_action(row, [_range(values, -1.0, 1.0)])
    assert "--method-for 't=percentile'" in suggested_action(row, [_range(values, -60.0, 60.0)])
    assert suggested_action(row, [_range(values, -4.5, 4.5)]) == "keep it float: --exclude 'conv'"
    assert suggested_action(dict(row, advice="try CLE"), []) == "try CLE"
    small = _row("out", "conv", 0.01)  # 40 dB
    assert suggested_action(small, [_range(values, -1.0, 1.0)]).startswith("none needed")


def test_page_draws_every_tensor_marks_the_worst_and_keeps_extra_fields():
    rows = [_row("a", "conv_a", 0.001, foo="bar"), _row("b", "conv_b", 0.05)]
    worst = worst_layers(rows, {"conv_b": [ChosenRange("a", -1, 1)]}, 5)
    page = render(rows, worst, {}, "t <1>")
    plot = page[page.index("aria-label='SQNR along graph'") :]
    assert len(re.findall(r"<circle ", plot)) == 2
    assert "#1</text>" in plot and "t &lt;1&gt;" in page
    assert "<th>foo</th>" in page and "<td>bar</td>" in page
    assert "http" not in page  # nothing fetched from elsewhere


def test_quantized_inputs_give_the_range_the_quantizelinear_encodes(tmp_path, calib_dir):
    model = graphs.conv_relu()
    f, q = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, f)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib_dir(model)), "-q"]) == 0
    quant = onnx.load(str(q))
    (chosen,) = quantized_inputs(quant)["conv"]
    scale = next(
        onnx.numpy_helper.to_array(t)
        for t in quant.graph.initializer
        if any(n.op_type == "QuantizeLinear" and n.input[1] == t.name for n in quant.graph.node)
    )
    assert chosen.tensor == "x"
    assert chosen.low == pytest.approx(-128 * float(scale))
    assert chosen.high == pytest.approx(127 * float(scale))
    batches = graphs.random_batches(model, 3)
    (measured,) = tensor_ranges(model, [chosen], batches, 2)
    values = np.concatenate([b["x"].ravel() for b in batches[:2]])
    assert sum(measured.counts) == values.size
    assert measured.observed_max == pytest.approx(float(values.max()))
    inside = (values >= chosen.low) & (values <= chosen.high)
    assert measured.clipped == pytest.approx(1 - inside.mean())


def test_cli_writes_the_page_with_plot_and_histograms(tmp_path, calib_dir):
    model = graphs.residual_add()
    f, q, page = tmp_path / "f.onnx", tmp_path / "q.onnx", tmp_path / "a.html"
    onnx.save(model, f)
    calib = calib_dir(model)
    assert main(["quantize", str(f), "-o", str(q), "--calib", str(calib), "-q"]) == 0
    assert main(["analyze", str(f), str(q), "--calib", str(calib), "--report", str(page)]) == 0
    text = page.read_text()
    assert "Error along the graph" in text and "aria-label='SQNR along graph'" in text
    assert "aria-label='histogram'" in text and "chosen range" in text
