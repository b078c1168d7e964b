"""Cost tables: the shipped ones, the files ``onnxq tune-cpu`` writes, and their errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from onnxq.backends import tune
from onnxq.backends.cost_tables import SHIPPED, CostTable
from onnxq.backends.cpu import CPU_CLASSES
from onnxq.cli import main
from onnxq.errors import ConfigError


def test_every_class_has_a_shipped_table():
    assert set(SHIPPED) == set(CPU_CLASSES)
    assert all(table.cpu == name for name, table in SHIPPED.items())


def test_a_table_file_round_trips(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(SHIPPED["x86-avx2"].to_json(), encoding="utf-8")
    assert CostTable.from_file(path) == SHIPPED["x86-avx2"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="other"), "not an onnxq cost table"),
        (lambda d: d.update(version=9), "version 9; this onnxq reads 1"),
        (lambda d: d.pop("min_macs"), "missing \\['min_macs'\\]"),
        (lambda d: d.update(speed=1), "unknown \\['speed'\\]"),
        (lambda d: d.update(min_macs=-1), "min_macs: expected int, got -1"),
        (lambda d: d.update(float_grouped_convs="yes"), "float_grouped_convs: expected bool"),
        (lambda d: d.update(cpu="zen4"), "unknown CPU class 'zen4'"),
    ],
)
def test_a_bad_table_file_says_what_is_wrong(tmp_path, edit, message):
    data = json.loads(SHIPPED["x86-vnni"].to_json())
    edit(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"cost_table {path}: .*{message}"):
        CostTable.from_file(path)


def test_an_unreadable_table_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        CostTable.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match="not JSON"):
        CostTable.from_file(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("ratios", "threshold"),
    [
        ([(8, 0.9), (16, 1.0), (32, 1.9)], 16),
        ([(8, 1.2), (16, 0.9), (32, 1.9)], 32),  # a loss above a win: from above it
        ([(8, 1.2), (16, 1.3)], 8),
        ([(8, 0.5), (16, 0.9)], tune.NEVER),
    ],
)
def test_a_threshold_is_where_int8_wins_from_on(ratios, threshold):
    assert tune.pays_from(ratios) == threshold


def test_the_tuned_table_is_derived_from_the_measurements(monkeypatch):
    # the times are replaced: int8 wins from 24 products (aligned), 90 (unaligned), loses on
    # depthwise convs, and on small maps wins from 65536 multiply-adds
    def session(model: bytes, case: tune.ConvCase, runs: int) -> float:
        int8 = b"QuantizeLinear" in model
        if case in tune.SMALL:
            pays = case.macs >= 65536
        elif case.group > 1:
            pays = False
        else:
            pays = case.products >= (24 if case.cin % 4 == 0 else 90)
        return 1.0 if int8 == pays else 2.0

    monkeypatch.setattr(tune, "session_us", session)
    monkeypatch.setenv("ONNXQ_TARGET_CPU", "arm64-dot")
    lines: list[str] = []
    table = tune.tune_cost_table(runs=1, log=lines.append)
    assert (table.cpu, table.float_grouped_convs, table.channel_alignment) == (
        "arm64-dot",
        True,
        4,
    )
    assert (table.min_macs_per_output, table.min_macs_per_output_unaligned) == (24, 90)
    assert table.min_macs == 65536
    assert "onnxruntime" in table.measured_on and len(lines) > 20


def test_tune_cpu_writes_a_table_quantize_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tune, "tune_cost_table", lambda runs: SHIPPED["arm64"])
    out = tmp_path / "arm.json"
    assert main(["tune-cpu", "-o", str(out)]) == 0
    assert CostTable.from_file(out) == SHIPPED["arm64"]
    assert f"--cost-table {out}" in capsys.readouterr().out


def test_real_models_run_and_name_their_kernel():
    case = tune.ConvCase(8, 8, 1, 8)
    us, op = tune.conv_kernel_us(tune.conv_model(case, True), case, runs=2)
    assert op == "QLinearConv" and us >= 0
    us, op = tune.conv_kernel_us(tune.conv_model(case, False), case, runs=2)
    assert op in ("Conv", "FusedConv")
    assert tune.session_us(tune.conv_model(case, True), case, runs=2) > 0


@pytest.mark.parametrize("machine", ["x86-avx2", "x86-vnni"])
def test_the_int8_convs_are_timed_with_the_weight_type_of_this_class(monkeypatch, machine):
    weights: set[str] = set()

    def session(model: bytes, case: tune.ConvCase, runs: int) -> float:
        graph = onnx.load_from_string(model).graph
        weights.update(
            onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name
            for t in graph.initializer
            if t.name == "wq"
        )
        return 1.0

    monkeypatch.setattr(tune, "session_us", session)
    monkeypatch.setenv("ONNXQ_TARGET_CPU", machine)
    tune.tune_cost_table(runs=1, log=lambda line: None)
    assert weights == {CPU_CLASSES[machine].weight_dtype}


def test_a_conv_with_uint8_weights_runs_as_a_qlinearconv_with_the_same_numbers():
    case = tune.ConvCase(8, 8, 3, 8)
    _, op = tune.conv_kernel_us(tune.conv_model(case, True, "uint8"), case, runs=1)
    assert op == "QLinearConv"
    outputs = [
        tune._session(tune.conv_model(case, True, dtype), profile=False).run(  # type: ignore[attr-defined]
            None, tune._feed(case)
        )[0]
        for dtype in ("int8", "uint8")
    ]
    np.testing.assert_array_equal(*outputs)
