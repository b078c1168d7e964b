"""The report: JSON/HTML content, summary lines, determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

import onnxq
from onnxq.backends.validate import OutputFidelity
from onnxq.errors import Violation
from onnxq.materialize.qdq import Placed
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Decision
from onnxq.report.compose import Report
from tests import graphs


@pytest.fixture(scope="module")
def residual_report() -> Report:
    model = graphs.residual_add()
    return onnxq.quantize(model, graphs.random_batches(model, 3), progress=False).report


def test_report_dict_summarises_the_run(residual_report):
    d = residual_report.to_dict()
    assert d["onnxq_version"] == onnxq.__version__
    assert d["model"] == "<in-memory model>" and d["backend"] == "tensorrt"
    assert d["config"]["backend"] == "tensorrt"
    assert d["summary"] == {
        "ops": 4,
        "quantized_ops": 3,
        "float_ops": 1,
        "quantized_tensors": 4,
        "calibration_batches": 3,
        "weight_bytes": d["summary"]["weight_bytes"],
    }
    # two 16x16x3x3 float convs with biases; int8 weights plus scales are under a third
    assert d["summary"]["weight_bytes"]["float"] == 2 * 4 * (16 * 16 * 9 + 16)
    assert d["summary"]["weight_bytes"]["quantized"] < 18560 / 3
    assert [t["tensor"] for t in d["quantized_tensors"]] == [
        "x",
        "conv1.weight",
        "skip",
        "conv2.weight",
    ]
    assert [o["node"] for o in d["quantized_ops"]] == ["conv1", "conv2", "add"]
    assert d["float_ops"] == [
        {
            "node": "relu1",
            "op_type": "Relu",
            "reason": "no tensorrt rule quantizes Relu: it stays float",
        }
    ]
    assert d["violations"] == [] and d["fidelity"]["outputs"][0]["name"] == "y"


def test_quantized_tensor_entries(residual_report):
    entries = {t["tensor"]: t for t in residual_report.to_dict()["quantized_tensors"]}
    act, weight = entries["skip"], entries["conv2.weight"]
    assert act["kind"] == "activation" and act["method"].startswith("auto:")  # names its choice
    assert act["dtype"] == "int8" and act["zero_point"] == 0 and act["axis"] is None
    assert isinstance(act["scale"], float) and act["scale"] > 0
    assert act["range"][0] == -act["range"][1]
    assert act["consumers"] == ["conv2:0", "add:1"]
    assert weight["axis"] == 0 and len(weight["scale"]) == 16 and weight["zero_point"] == [0]


def test_json_is_deterministic_and_strict(residual_report):
    text = residual_report.to_json()
    assert text == residual_report.to_json() and text.endswith("\n")
    assert json.loads(text) == residual_report.to_dict()
    assert "NaN" not in text and "Infinity" not in text


def test_json_writes_a_non_finite_number_as_null():
    report = Report(
        model="m.onnx",
        backend="tensorrt",
        config={},
        simplify_passes=[],
        decisions=[],
        placed=[],
        calibration_batches=1,
        warnings=[],
        notes=[],
    )
    report.fidelity = [OutputFidelity("y", float("nan"), float("inf"), 1.0)]
    out = json.loads(report.to_json())["fidelity"]["outputs"][0]
    assert out["cosine"] is None and out["max_abs_error"] is None and out["float_max_abs"] == 1.0


def test_summary_lines(residual_report):
    lines = residual_report.summary().splitlines()
    assert lines[0] == (
        "backend tensorrt: 3 of 4 ops quantized, 4 tensors with Q/DQ, 3 calibration batches"
    )
    assert lines[1] == "left float:"
    assert lines[2].strip() == "1 x Relu: no tensorrt rule quantizes Relu: it stays float"
    # tensorrt computes what stays float in FP16: the Relu and the Add; y is cast back to FP32
    assert lines[3] == (
        "precision: float compute in fp16; multiply-adds 100.0% int8; ops 2 fp16, 2 int8; "
        "1 Cast(s) at precision boundaries"
    )
    assert lines[4].startswith("fidelity y (onnxruntime, fusion off")


def test_summary_groups_reasons_and_truncates():
    decisions = [Decision(f"n{i}", f"Op{i % 14}", False, "", f"reason {i % 14}") for i in range(28)]
    report = Report("m.onnx", "tensorrt", {}, decisions=decisions, warnings=["careful"])
    lines = report.summary().splitlines()
    assert lines[2].strip().startswith("2 x Op0: reason 0")
    assert sum(line.strip().startswith("2 x") for line in lines) == 12
    assert "... 2 more reasons in the report file" in lines[-2]
    assert lines[-1] == "warning: careful"


def test_summary_groups_reasons_that_differ_only_in_names():
    decisions = [
        Decision(f"add{i}", "Add", False, "", f"input 'bias{i}' is a constant") for i in range(3)
    ]
    decisions.append(Decision("mm", "MatMul", False, "", "its output 'out0' is a graph output"))
    lines = Report("m.onnx", "tensorrt", {}, decisions=decisions).summary().splitlines()
    # the real names of the first, and how many more: no name elided
    assert "     3 x Add: input 'bias0' is a constant (and 2 more with other names)" in lines
    assert "     1 x MatMul: its output 'out0' is a graph output" in lines  # alone: names kept


def test_summary_shortens_only_very_long_names_keeping_both_ends():
    long = "/model/encoder/layers.11/self_attention/key_projection/MatMul_output_0"
    same = [
        Decision(f"mm{i}", "MatMul", False, "", f"input {long!r} is a constant") for i in (1, 2)
    ]
    short = Decision("add", "Add", False, "", "input 'onnx::Add_12' is a constant")
    lines = Report("m.onnx", "tensorrt", {}, decisions=[*same, short]).summary().splitlines()
    (mm,) = [line for line in lines if "MatMul" in line]
    shown = "'/model/encoder/layers.11…tion/key_projection/MatMul_output_0'"
    assert mm == f"     2 x MatMul: input {shown} is a constant"
    assert len(mm.split("'")[1]) == 60 and "…" in mm
    assert "     1 x Add: input 'onnx::Add_12' is a constant" in lines


def test_html_is_escaped_and_self_contained(tmp_path):
    placed = [
        Placed(
            "<x>", "activation", QParams(np.float32(0.1), np.int8(0), None, "minmax", -1.0, 1.0), ()
        )
    ]
    report = Report(
        "<b>model</b>.onnx",
        "tensorrt",
        {},
        placed=placed,
        decisions=[Decision("n&1", "Relu", False, "", "a <reason>")],
        fidelity=[OutputFidelity("y", 0.99, 0.1, 1.0)],
        fidelity_mode="m",
    )
    html = report.to_html()
    assert html.startswith("<!doctype html>")
    assert "&lt;b&gt;model&lt;/b&gt;.onnx" in html and "<b>model" not in html
    assert "&lt;x&gt;" in html and "n&amp;1" in html and "a &lt;reason&gt;" in html
    assert "http" not in html  # nothing fetched from elsewhere
    assert "Violations" not in html  # only when there are some
    path = tmp_path / "r.html"
    report.write(path)
    assert path.read_text(encoding="utf-8") == html


def test_write_json_atomically(tmp_path, residual_report):
    path = tmp_path / "report.json"
    residual_report.write(path)
    assert json.loads(path.read_text(encoding="utf-8")) == residual_report.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_report_of_a_saved_model_has_no_absolute_paths(tmp_path, model_file, calib_dir):
    path = model_file(graphs.conv_relu())
    result = onnxq.quantize(path, calib_dir(graphs.conv_relu(), n=2), progress=False)
    text = result.report.to_json()
    assert json.loads(text)["model"] == "model.onnx"
    assert str(tmp_path) not in text


def test_notes_and_per_channel_values_are_listed():
    qp = QParams(
        np.array([0.1, 0.2], np.float32),
        np.zeros(2, np.int8),
        0,
        "minmax",
        -1.0,
        1.0,
        note="constant zero",
    )
    report = Report("m", "tensorrt", {}, placed=[Placed("w", "weight", qp, (("conv", 1),))])
    (entry,) = report.to_dict()["quantized_tensors"]
    assert entry["scale"] == pytest.approx([0.1, 0.2]) and entry["zero_point"] == [0]
    assert entry["note"] == "constant zero" and entry["consumers"] == ["conv:1"]


def test_summary_says_how_each_output_was_compared():
    report = Report(
        "m.onnx",
        "tensorrt",
        {},
        fidelity_mode="fusion off",
        fidelity=[
            OutputFidelity("probs", 0.99, 0.1, 1.0, top1_agreement=0.875),
            OutputFidelity("label", 0.75, 0.0, 0.0, "agreement"),
            OutputFidelity(
                "maps", 0.0, 0.0, 0.0, "not compared: a list output, not a numeric tensor"
            ),
        ],
    )
    lines = [ln for ln in report.summary().splitlines() if ln.startswith("fidelity")]
    assert lines == [
        "fidelity probs (fusion off): cosine 0.990000, max abs error 0.1 (float range 1), "
        "top-1 agreement 87.50%",
        "fidelity label (fusion off): equal to the float model's in 75.0% of its values on the "
        "held batches",
        "fidelity maps: not compared: a list output, not a numeric tensor",
    ]
    html = report.to_html()
    assert "<td>agreement</td>" in html
    # top-1 agreement: 0.875 for the softmax output, '-' where it does not apply
    assert "'>0.875</td>" in html and "<td>-</td>" in html


def test_html_lists_quantized_ops_rules_and_violations():
    decisions = [
        Decision("conv", "Conv", True, "weighted_op", "", ("x", "w")),
        Decision("ln", "LayerNormalization", False, "weighted_op", "kept float"),
    ]
    report = Report(
        "m.onnx",
        "tensorrt",
        {"method": "auto <x>"},
        decisions=decisions,
        violations=[Violation("conv", "zero_point", "0", "3")],
    )
    html = report.to_html()
    assert "<summary>Quantized ops (1)</summary>" in html
    assert "<td>conv</td><td>Conv</td><td>weighted_op</td><td>x, w</td>" in html
    assert "<td>ln</td><td>LayerNormalization</td><td>kept float</td><td>weighted_op</td>" in html
    assert "<summary>Violations (1)</summary>" in html
    assert "<td>zero_point</td><td>0</td><td>3</td>" in html
    assert '"method": "auto &lt;x&gt;"' in html


def test_html_shows_a_range_clipped_at_its_readers_bounds():
    from tests import graphs

    model = graphs.conv_hardswish("pair")
    result = onnxq.quantize(
        model,
        graphs.random_batches(model, 4),
        backend="onnxruntime",
        method="minmax",
        progress=False,
    )
    html = result.report.to_html()
    assert "<th>bound</th>" in html
    assert "every reader saturates beyond</td>" in html


class Step:
    """A feature's record as the report sees it (onnxq.report.section.Section)."""

    def __init__(self, key: str, lines: list[str]) -> None:
        self.key, self.lines = key, lines

    def to_dict(self) -> dict[str, object]:
        return {self.key: {"lines": len(self.lines)}} if self.lines else {}

    def summary_lines(self) -> list[str]:
        return list(self.lines)


def test_report_composes_its_sections_in_order_between_the_ops_and_fidelity():
    report = Report(
        "m.onnx",
        "tensorrt",
        {},
        sections=[Step("second", ["b1", "b2"]), Step("empty", []), Step("first", ["a"])],
        fidelity=[OutputFidelity("y", 0.99, 0.1, 1.0)],
        fidelity_mode="m",
    )
    d = report.to_dict()
    keys = list(d)
    assert keys[keys.index("float_ops") + 1 : keys.index("fidelity")] == ["second", "first"]
    assert d["second"] == {"lines": 2} and "empty" not in d
    lines = report.summary().splitlines()
    assert lines[1:4] == ["b1", "b2", "a"] and lines[4].startswith("fidelity y (m): cosine")
    assert report.mixed_precision is None and report.recovery == {}


def test_report_reads_its_sections_entries_back():
    report = Report("m.onnx", "tensorrt", {}, sections=[Step("mixed_precision", ["x"])])
    assert report.mixed_precision == {"lines": 1}
    assert report.entries() == {"mixed_precision": {"lines": 1}}


class Layers(Step):
    """A weight-only body (onnxq.report.section.Body)."""

    mode = "weight-only"
    layers = ("q", "k")
    skipped = (("v", "MatMul", "excluded"),)

    def figures(self) -> dict[str, int]:
        return {"layers": 2, "left_float": 1}

    def headline(self) -> str:
        return "2 layers quantized, 1 left float"

    def html(self) -> str:
        return "<h2>Layers</h2>"


def test_a_body_replaces_the_ops_in_the_json_and_the_summary():
    report = Report(
        "m.onnx",
        "onnxruntime",
        {"weights": "int4"},
        calibration_batches=4,
        fidelity=[OutputFidelity("logits", 0.999, 0.5, 10.0, top1_agreement=1.0)],
        fidelity_mode="m",
        notes=["n"],
        weight_bytes=(4 * 2**20, 2**20),
        body=Layers("layers", ["  2 x int4"]),
    )
    d = report.to_dict()
    assert list(d) == [
        "onnxq_version",
        "model",
        "backend",
        "mode",
        "config",
        "simplify_passes",
        "summary",
        "layers",
        "fidelity",
        "violations",
        "notes",
        "warnings",
    ]
    assert d["mode"] == "weight-only"
    assert d["summary"] == {
        "layers": 2,
        "left_float": 1,
        "calibration_batches": 4,
        "weight_bytes_float": 4 * 2**20,
        "weight_bytes_stored": 2**20,
    }
    assert report.summary().splitlines() == [
        "backend onnxruntime, weight-only: 2 layers quantized, 1 left float; weights 4.0 MB -> "
        "1.0 MB; 4 calibration batches",
        "  2 x int4",
        "fidelity logits: cosine 0.999000, max abs error 0.5 (float range 10), top-1 agreement "
        "100.00%",
        "note: n",
    ]
    assert report.layers == ["q", "k"] and report.skipped == [("v", "MatMul", "excluded")]
    html = report.to_html()
    assert "<h1>onnxq weight-only report: m.onnx</h1>" in html and "<h2>Layers</h2>" in html
    assert html.startswith("<!doctype html><html lang='en'>")  # the shared page skeleton
