"""The command line, in-process (``main([...])``) and as ``python -m onnxq.cli``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from tests import graphs


def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnxq.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_user_error(code: int, err: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxq: error: ")
    assert "Traceback" not in err


# ------------------------------------------------------------------------------- quantize
def test_quantize_writes_a_model_that_passes_check(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    code = main(
        [
            "quantize",
            str(model),
            "-o",
            str(out),
            "--calib",
            str(calib),
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert out.is_file()
    assert check(ir.load_model(out), PROFILES["tensorrt"]) == []
    assert captured.out.startswith("backend tensorrt: 1 of 2 ops quantized")
    assert f"wrote {out}, {tmp_path / 'r.json'}" in captured.out
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["calibration_batches"] == 3


def test_quantize_quiet_with_options(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    code = main(
        [
            "quantize",
            str(model),
            "-o",
            str(out),
            "--calib",
            str(calib),
            "-q",
            "--backend",
            "onnxruntime",
            "--method",
            "minmax",
            "--max-batches",
            "2",
            "--no-simplify",
            "--exclude",
            "nothing*",
        ]
    )
    assert code == 0 and capsys.readouterr().out == ""
    assert check(ir.load_model(out), PROFILES["onnxruntime"]) == []


@pytest.mark.parametrize(
    "case",
    ["missing model", "missing calib", "output is input", "missing output folder", "bad config"],
)
def test_quantize_user_errors_exit_2_with_one_line(tmp_path, conv_files, capsys, case):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    args = {
        "missing model": [str(tmp_path / "nope.onnx"), "-o", str(out), "--calib", str(calib)],
        "missing calib": [str(model), "-o", str(out), "--calib", str(tmp_path / "nocalib")],
        "output is input": [str(model), "-o", str(model), "--calib", str(calib)],
        "missing output folder": [
            str(model),
            "-o",
            str(tmp_path / "no" / "out.onnx"),
            "--calib",
            str(calib),
        ],
        "bad config": [
            str(model),
            "-o",
            str(out),
            "--calib",
            str(calib),
            "--config",
            str(tmp_path / "missing.yaml"),
        ],
    }[case]
    before = model.read_bytes()
    code = main(["quantize", *args])
    assert_user_error(code, capsys.readouterr().err)
    assert not out.exists()
    assert model.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib", "model.onnx"]


def test_report_write_failure_leaves_no_model(tmp_path, conv_files, capsys):
    # exit 2 promises "nothing written": a report path in a missing folder must not leave the
    # quantized model behind
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    code = main(
        [
            "quantize",
            str(model),
            "-o",
            str(out),
            "--calib",
            str(calib),
            "-q",
            "--report",
            str(tmp_path / "missing" / "r.json"),
        ]
    )
    assert_user_error(code, capsys.readouterr().err)
    assert not out.exists()


def test_an_output_that_breaks_the_backend_is_an_internal_error_that_writes_nothing(
    tmp_path, conv_files, capsys, monkeypatch
):
    # quantize checks its own output: a violation there is onnxq's bug, not a user error
    from onnxq.errors import Violation

    monkeypatch.setattr(
        "onnxq.validate.verify.check",
        lambda model, profile: [
            Violation("conv", "bias scale", "input scale x weight scale", "2x off")
        ],
    )
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    code = main(["quantize", str(model), "-o", str(out), "--calib", str(calib), "-q"])
    err = capsys.readouterr().err
    assert code == 3
    (last,) = err.strip().splitlines()[-1:]
    assert last.startswith(
        "onnxq: internal error: the quantized model breaks 1 tensorrt constraint(s), first: conv"
    )
    assert "this is a bug in onnxq" in last and "please report it" in last
    assert "Traceback" in err and not out.exists()  # the traceback goes with the report


@pytest.mark.parametrize("batch_size", ["0", "-1"])
def test_bad_batch_size_is_a_user_error(tmp_path, model_file, capsys, batch_size):
    model = model_file(graphs.conv_relu())
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.zeros((4, 16, 8, 8), np.float32))
    out = tmp_path / "out.onnx"
    code = main(
        [
            "quantize",
            str(model),
            "-o",
            str(out),
            "--calib",
            str(samples),
            "-q",
            "--batch-size",
            batch_size,
        ]
    )
    assert_user_error(code, capsys.readouterr().err)
    assert not out.exists()


# ------------------------------------------------------------------------------- check
def test_check_clean_model_exits_0(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    assert main(["check", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: 0 tensorrt violation(s), 3 Q/DQ nodes"


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_check_of_a_float_model_says_there_was_nothing_to_check(conv_files, capsys, backend):
    model, _ = conv_files
    assert main(["check", str(model), "--backend", backend]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"{model}: 0 {backend} violation(s), 0 Q/DQ nodes"
    assert lines[1].startswith("note: the model has no Q/DQ nodes, so there was nothing to check")
    assert ("typing" in lines[1]) == (backend == "tensorrt")  # TensorRT's typing rules ran
    assert len(lines) == 2  # no "fused 0 of 0 groups" line for onnxruntime


def test_check_of_onnxqs_own_output_that_kept_every_op_float_says_so(
    tmp_path, model_file, calib_dir, capsys
):
    # a 3-channel conv: INT8 does not pay on TensorRT, so onnxq's output has no Q/DQ at all
    small = graphs.conv_small()
    model, calib = model_file(small), calib_dir(small, n=2)
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    capsys.readouterr()
    assert main(["check", str(out), "--backend", "tensorrt"]) == 0
    note = capsys.readouterr().out.strip().splitlines()[1]
    assert note.startswith("note: onnxq quantized this model (its metadata says so) and placed")
    assert "INT8 paid for none of its ops" in note and "quantize it first" not in note
    assert "`onnxq explain FLOAT.onnx --backend tensorrt`" in note and "--report" in note


@pytest.fixture
def dynamic_quantized(model_file, tmp_path) -> Path:
    """A model quantized by onnxruntime's quantize_dynamic: operator format, no Q/DQ."""
    from onnxruntime.quantization import quantize_dynamic

    src = model_file(graphs.matmul_const(k=64, n=64))
    out = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(src), str(out))
    return out


@pytest.mark.parametrize("backend, rc", [("tensorrt", 1), ("onnxruntime", 0)])
def test_check_of_an_operator_format_model_says_what_it_is(dynamic_quantized, capsys, backend, rc):
    assert main(["check", str(dynamic_quantized), "--backend", backend]) == rc
    out = capsys.readouterr().out
    assert "note: the model is quantized in onnxruntime's operator format (" in out
    assert "MatMulInteger x1" in out and "nothing to check" not in out
    if backend == "tensorrt":  # TensorRT's parser reads none of those ops
        assert "expected Q/DQ format (no MatMulInteger)" in out
        assert "expected Q/DQ format (no DynamicQuantizeLinear)" in out


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_quantize_and_explain_of_an_operator_format_model(
    dynamic_quantized, calib_dir, capsys, backend
):
    calib = calib_dir(graphs.matmul_const(k=64, n=64), n=2)
    out = dynamic_quantized.parent / "again.onnx"
    assert (
        main(
            [
                "quantize",
                str(dynamic_quantized),
                "-o",
                str(out),
                "--calib",
                str(calib),
                "--backend",
                backend,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "already quantized in onnxruntime's operator format" in err and "Traceback" not in err
    assert "onnxq check" not in err  # check has nothing to say about such a model
    # the TensorRT remark only where TensorRT is the target
    assert ("TensorRT reads only Q/DQ models" in err) == (backend == "tensorrt")
    assert not out.exists()
    assert main(["explain", str(dynamic_quantized), "--backend", backend]) == 0
    captured = capsys.readouterr()
    assert "MatMulInteger is already a quantized op" in captured.out
    # explain says up front that quantize will refuse the model
    assert "`onnxq quantize` refuses this model: " in captured.err
    assert "already quantized in onnxruntime's operator format" in captured.err


def test_check_bad_model_exits_1_and_lists_violations(tmp_path, model_file, calib_dir, capsys):
    tailed = graphs.with_tail(graphs.conv_relu())  # so onnxruntime quantizes the conv
    model, calib = model_file(tailed), calib_dir(tailed, n=3)
    out = tmp_path / "ort.onnx"
    assert (
        main(
            [
                "quantize",
                str(model),
                "-o",
                str(out),
                "--calib",
                str(calib),
                "-q",
                "--backend",
                "onnxruntime",
            ]
        )
        == 0
    )
    assert main(["check", str(out), "--backend", "onnxruntime"]) == 0
    capsys.readouterr()
    # onnxruntime's uint8 asymmetric activations and int32 bias break TensorRT's rules
    assert main(["check", str(out), "--backend", "tensorrt"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(
        ": zero_point dtype: expected float8e4m3fn or int8, got uint8" in line for line in lines
    )
    assert lines[-1].startswith(f"{out}: {len(lines) - 1} tensorrt violation(s)")


def test_check_unreadable_model_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage" * 8)
    assert_user_error(main(["check", str(bad)]), capsys.readouterr().err)


# ------------------------------------------------------------------------------- explain
def test_explain_prints_one_line_per_op(model_file, capsys):
    path = model_file(graphs.residual_add())
    assert main(["explain", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 + 1
    by_node = {line.split()[0]: line for line in lines[:-1]}
    assert set(by_node) == {"conv1", "relu1", "conv2", "add"}
    assert "quantized by conv: x, conv1.weight" in by_node["conv1"]
    assert "float: no tensorrt rule quantizes Relu" in by_node["relu1"]
    assert "quantized by residual_add: skip" in by_node["add"]
    assert lines[-1].startswith("3 of 4 ops quantized for tensorrt (before calibration: ")


def test_explain_with_exclude_and_closest_rule(model_file, capsys):
    path = model_file(graphs.conv_small())
    assert main(["explain", str(path), "--exclude", "relu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "[closest rule: conv]" in lines[0] and "min_channels=16" in lines[0]
    assert "excluded by --exclude relu" in lines[1]
    assert lines[-1].startswith("0 of 2 ops quantized for tensorrt (before calibration")


def test_explain_takes_the_backend_from_the_config(tmp_path, model_file, capsys):
    path = model_file(graphs.conv_small())
    config = tmp_path / "ort.yaml"
    config.write_text("backend: onnxruntime\n", encoding="utf-8")
    assert main(["explain", str(path), "--config", str(config)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "quantized for onnxruntime (before calibration" in lines[-1]
    assert main(["explain", str(path), "--config", str(config), "--backend", "tensorrt"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "quantized for tensorrt (before calibration" in last


# ------------------------------------------------------------------------------- help
@pytest.mark.parametrize("command", [[], ["quantize"], ["check"], ["explain"]])
def test_help_works_for_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: onnxq")
    if command == ["quantize"]:
        assert "--calib DATA" in out and "exit codes" in out


def test_missing_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "usage: onnxq" in capsys.readouterr().err


# ------------------------------------------------------------------------------- subprocess
def test_module_quantize_then_check(tmp_path, conv_files):
    model, calib = conv_files
    out = tmp_path / "out.onnx"
    done = run_module(
        "quantize", str(model), "-o", str(out), "--calib", str(calib), "-q", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file() and done.stdout == ""
    done = run_module("check", str(out), cwd=tmp_path)
    assert done.returncode == 0 and "0 tensorrt violation(s)" in done.stdout


def test_module_user_error_is_one_line_without_traceback(tmp_path, conv_files):
    model, _ = conv_files
    out = tmp_path / "out.onnx"
    done = run_module(
        "quantize", str(model), "-o", str(out), "--calib", str(tmp_path / "missing"), cwd=tmp_path
    )
    assert_user_error(done.returncode, done.stderr)
    assert "calibration data not found" in done.stderr
    assert not out.exists()


def test_module_version():
    done = subprocess.run(
        [sys.executable, "-m", "onnxq.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("onnxq ")


def test_method_for_sets_a_per_tensor_method(tmp_path, conv_files):
    from onnxq.materialize.qdq import read_metadata

    model, calib = conv_files
    out = tmp_path / "q.onnx"
    args = [
        "quantize",
        str(model),
        "-o",
        str(out),
        "--calib",
        str(calib),
        "-q",
        "--method",
        "percentile",
        "--method-for",
        "x=minmax",
    ]
    assert main(args) == 0
    records = read_metadata(onnx.load(str(out)))
    assert records is not None and records["x"]["method"] == "minmax"


def test_method_for_needs_glob_equals_method(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "q.onnx"
    args = ["quantize", str(model), "-o", str(out), "--calib", str(calib), "--method-for", "x"]
    assert main(args) == 2
    assert "expected GLOB=METHOD" in capsys.readouterr().err
    assert not out.exists()


def test_explain_notes_a_model_with_per_element_sigmoid_scores(model_file, capsys):
    path = model_file(graphs.with_tail(graphs.conv_relu(), "Sigmoid"))
    assert main(["explain", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("note: output ") and "per-element sigmoid scores" in lines[-1]


# ------------------------------------------------------------------------------- output paths
@pytest.mark.parametrize(
    "extra, what",
    [
        (["--report", "{model}"], "report"),
        (["--save-calibration", "{model}"], "calibration cache to save"),
        (["--report", "{out}"], "report"),
        (["--save-calibration", "{out}"], "calibration cache to save"),
    ],
)
def test_no_output_names_an_input_or_another_output(tmp_path, conv_files, capsys, extra, what):
    model, calib = conv_files
    before = model.read_bytes()
    out = tmp_path / "out.onnx"
    args = [a.format(model=model, out=out) for a in extra]
    code = main(["quantize", str(model), "-o", str(out), "--calib", str(calib), "-q", *args])
    err = capsys.readouterr().err
    assert_user_error(code, err)
    assert f"onnxq: error: {what} " in err and "choose another path" in err
    assert model.read_bytes() == before and not out.exists()


def test_analyze_report_never_replaces_a_model(tmp_path, conv_files, capsys):
    model, calib = conv_files
    before = model.read_bytes()
    code = main(["analyze", str(model), str(model), "--calib", str(calib), "--report", str(model)])
    assert_user_error(code, capsys.readouterr().err)
    assert model.read_bytes() == before


def test_written_files_get_the_usual_mode(tmp_path, conv_files):
    import os

    model, calib = conv_files
    out, report, cache = tmp_path / "o.onnx", tmp_path / "o.json", tmp_path / "c.json"
    old = os.umask(0o022)
    try:
        assert (
            main(
                [
                    "quantize",
                    str(model),
                    "-o",
                    str(out),
                    "--calib",
                    str(calib),
                    "-q",
                    "--report",
                    str(report),
                    "--save-calibration",
                    str(cache),
                ]
            )
            == 0
        )
    finally:
        os.umask(old)
    for path in (out, report, cache):
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_a_preprocess_spec_with_array_batches_is_a_user_error(tmp_path, conv_files, capsys):
    model, calib = conv_files
    code = main(
        [
            "quantize",
            str(model),
            "-o",
            str(tmp_path / "o.onnx"),
            "--calib",
            str(calib),
            "--preprocess",
            "imagenet",
        ]
    )
    err = capsys.readouterr().err
    assert_user_error(code, err)
    assert "holds .npz/.npy batches" in err and "image folders only" in err


def test_an_exclude_pattern_that_matches_nothing_is_warned_about(tmp_path, conv_files, capsys):
    model, calib = conv_files
    report = tmp_path / "o.json"
    assert (
        main(
            [
                "quantize",
                str(model),
                "-o",
                str(tmp_path / "o.onnx"),
                "--calib",
                str(calib),
                "-q",
                "--exclude",
                "nomatch",
                "--exclude",
                "conv*",
                "--method-for",
                "relu*=minmax",
                "--report",
                str(report),
            ]
        )
        == 0
    )
    warnings = json.loads(report.read_text())["warnings"]
    unmatched = [w for w in warnings if "matches no node or tensor" in w]
    assert len(unmatched) == 1 and unmatched[0].startswith("--exclude 'nomatch'")
    # -q drops the summary, not the warnings: one stderr line each, nothing on stdout
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"onnxq: warning: {w}" for w in warnings]


def test_check_rejects_a_malformed_shape_even_without_engine(conv_files, capsys):
    model, _ = conv_files
    code = main(["check", str(model), "--shape", "bad"])
    assert_user_error(code, capsys.readouterr().err)


def test_analyze_warns_when_the_models_look_swapped(tmp_path, conv_files, capsys):
    model, calib = conv_files
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model), "-o", str(out), "--calib", str(calib), "-q"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out), str(model), "--calib", str(calib), "--top", "1"]) == 0
    assert "are the two swapped?" in capsys.readouterr().err


def test_output_closed_early_ends_quietly(tmp_path, model_file):
    # 3000 ops: explain writes more than a pipe holds after `head` has gone
    from onnx import helper

    nodes = [
        helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu_{i:04d}")
        for i in range(3000)
    ]
    model = graphs.model(nodes, [graphs.tensor("t0", [1, 4])], [graphs.tensor("t3000", [1, 4])])
    path = model_file(model)
    done = subprocess.run(
        f"{sys.executable} -m onnxq.cli explain {path} | head -c 1",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stderr == "" and len(done.stdout) == 1
