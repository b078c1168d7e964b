"""Reliability: every bad input is a one-line user error that writes nothing; Ctrl-C and SIGTERM
leave nothing behind; runs are byte-reproducible; models with external data round-trip; the
package never unpickles or evaluates code.

The bad-input matrix runs every case in-process (``onnxq.cli.main``: fast, and an unexpected
exception fails with its traceback) and a representative subset through
``python -m onnxq.cli`` (the real process: exit status, raw stderr bytes, warnings, native logs).
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "onnxq"
INPUT_SHAPE = (1, 16, 8, 8)


@pytest.fixture(autouse=True)
def keep_sigterm_handler():
    """``main()`` installs a SIGTERM handler; give pytest its own back."""
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


# ------------------------------------------------------------------------------- builders
def conv_model(size: int = 8, seed: int = 0) -> onnx.ModelProto:
    """x[1,16,S,S] -> Conv 3x3 (16 -> 16, bias) -> Relu -> y, opset 17."""
    r = np.random.default_rng(seed)
    w = (r.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32)
    b = (r.standard_normal(16) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node(
                "Conv",
                ["x", "conv.weight", "conv.bias"],
                ["conv_out"],
                name="conv",
                pads=[1, 1, 1, 1],
            ),
            helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
        ],
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, size, size])],
        [numpy_helper.from_array(w, "conv.weight"), numpy_helper.from_array(b, "conv.bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def two_conv_model(size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv -> Relu -> y: the first conv's output is quantizable for both
    backends (the onnxruntime backend leaves a conv whose output is a graph output float)."""
    first = conv_model(size, seed)
    second = conv_model(size, seed + 1)
    nodes = list(first.graph.node)
    nodes[-1].output[0] = "hidden"
    for node in second.graph.node:
        node.name += "2"
        node.input[:] = ["hidden" if i == "x" else i + "2" for i in node.input]
        node.output[:] = [o if o == "y" else o + "2" for o in node.output]
    nodes += list(second.graph.node)
    inits = list(first.graph.initializer)
    for t in second.graph.initializer:
        t.name += "2"
        inits.append(t)
    graph = helper.make_graph(
        nodes, "two_conv", list(first.graph.input), list(first.graph.output), inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def batches(
    n: int, shape=INPUT_SHAPE, seed: int = 0, name: str = "x", dtype=np.float32
) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    return [{name: r.standard_normal(shape).astype(dtype)} for _ in range(n)]


def write_calib(folder: Path, items: list[dict[str, np.ndarray]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(items):
        np.savez(folder / f"{i:04d}.npz", **batch)
    return folder


def save_external(
    model: onnx.ModelProto, path: Path, location: str | None = None, **fields: str
) -> Path:
    """Save with every tensor in ``w.data``; then rewrite ``location`` (and other external-data
    fields, e.g. ``offset``) in the header only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.data",
        size_threshold=0,
    )
    if location is None and not fields:
        return path
    header = onnx.load(str(path), load_external_data=False)
    changes = dict(fields)
    if location is not None:
        changes["location"] = location
    weight = next(t for t in header.graph.initializer if t.name == "conv.weight")
    for tensor in header.graph.initializer:
        entries = {e.key: e for e in tensor.external_data}
        for key, value in changes.items():
            if key != "location" and tensor is not weight:
                continue  # offset/length edits target the weight only
            if key in entries:
                entries[key].value = value
            else:
                tensor.external_data.add(key=key, value=value)
    path.write_bytes(header.SerializeToString())
    return path


# ------------------------------------------------------------------------------- workspace
@dataclass
class Workspace:
    """tmp/model/model.onnx (valid), tmp/calib/ (valid, 3 batches), tmp/out/ (empty)."""

    root: Path

    def __post_init__(self) -> None:
        self.model_dir = self.root / "model"
        self.model_dir.mkdir()
        self.model = self.model_dir / "model.onnx"
        onnx.save(conv_model(), str(self.model))
        self.calib = write_calib(self.root / "calib", batches(3))
        self.out_dir = self.root / "out"
        self.out_dir.mkdir()
        self.out = self.out_dir / "model.int8.onnx"
        self.outside = self.root / "outside"  # a folder next to the model's, never to be read
        self.outside.mkdir()

    def args(
        self,
        model: Path | str | None = None,
        calib: Path | str | None = None,
        out: Path | str | None = None,
        extra: tuple[str, ...] = (),
    ) -> list[str]:
        return [
            str(model or self.model),
            "-o",
            str(out or self.out),
            "--calib",
            str(calib or self.calib),
            *extra,
        ]

    def model_variant(self, edit: Callable[[onnx.ModelProto], None], name: str) -> Path:
        model = conv_model()
        edit(model)
        path = self.model_dir / name
        path.write_bytes(model.SerializeToString())
        return path


@dataclass(frozen=True)
class Case:
    """One bad input: how to build it, and a regex the one-line message must contain."""

    id: str
    build: Callable[[Workspace], list[str]]
    keyword: str
    refused: bool = False  # external data outside the model's folder: refused before reading
    subprocess: bool = False  # also run through ``python -m onnxq.cli``


# -- model files
def _text_file(ws: Workspace) -> list[str]:
    path = ws.model_dir / "notes.onnx"
    path.write_text("this is a text file, not a protobuf\n")
    return ws.args(model=path)


def _truncated(ws: Workspace) -> list[str]:
    data = conv_model().SerializeToString()
    path = ws.model_dir / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    return ws.args(model=path)


def _empty_file(ws: Workspace) -> list[str]:
    path = ws.model_dir / "empty.onnx"
    path.write_bytes(b"")
    return ws.args(model=path)


def _undefined_tensor(ws: Workspace) -> list[str]:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.node[1].input[0] = "never_produced"

    return ws.args(model=ws.model_variant(edit, "undefined.onnx"))


def _custom_domain(ws: Workspace) -> list[str]:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.node[1].domain = "com.example"
        m.graph.node[1].op_type = "FancyRelu"
        m.opset_import.add(domain="com.example", version=1)

    return ws.args(model=ws.model_variant(edit, "custom.onnx"))


def _opset_999(ws: Workspace) -> list[str]:
    def edit(m: onnx.ModelProto) -> None:
        m.opset_import[0].version = 999

    return ws.args(model=ws.model_variant(edit, "opset999.onnx"))


def _short_weight_payload(ws: Workspace) -> list[str]:
    # a protobuf-valid file whose 9 KB weight carries 4 bytes (a corrupted or hand-edited
    # model): the checker sees only a weightless copy, so onnxq must check payload sizes itself
    def edit(m: onnx.ModelProto) -> None:
        m.graph.initializer[0].raw_data = b"\0\0\0\0"

    return ws.args(model=ws.model_variant(edit, "short_payload.onnx"))


def _model_is_a_folder(ws: Workspace) -> list[str]:
    return ws.args(model=ws.model_dir)


# -- external data
def _ext(ws: Workspace, location: str | None = None, **fields: str) -> Path:
    return save_external(conv_model(), ws.root / "ext" / "model.onnx", location, **fields)


def _ext_missing(ws: Workspace) -> list[str]:
    path = _ext(ws)
    (path.parent / "w.data").unlink()
    return ws.args(model=path)


def _ext_dotdot_passwd(ws: Workspace) -> list[str]:
    return ws.args(model=_ext(ws, "../../etc/passwd"))


def _ext_dotdot_absent(ws: Workspace) -> list[str]:
    # the target does not exist: 'refused' (not 'not found') proves the check came first
    return ws.args(model=_ext(ws, "../outside/absent.data"))


def _ext_absolute_absent(ws: Workspace) -> list[str]:
    return ws.args(model=_ext(ws, str(ws.outside / "absent.data")))


def _ext_absolute_existing(ws: Workspace) -> list[str]:
    path = _ext(ws)
    shutil.copy(path.parent / "w.data", ws.outside / "w.data")
    return ws.args(model=_ext(ws, str(ws.outside / "w.data")))


def _ext_symlink_absent(ws: Workspace) -> list[str]:
    path = _ext(ws, "link.data")
    (path.parent / "link.data").symlink_to(ws.outside / "absent.data")
    return ws.args(model=path)


def _ext_symlink_existing(ws: Workspace) -> list[str]:
    path = _ext(ws, "link.data")
    shutil.copy(path.parent / "w.data", ws.outside / "w.data")  # a perfectly valid data file
    (path.parent / "link.data").symlink_to(ws.outside / "w.data")
    return ws.args(model=path)


def _ext_symlinked_folder(ws: Workspace) -> list[str]:
    path = _ext(ws, "sub/w.data")
    shutil.copy(path.parent / "w.data", ws.outside / "w.data")
    (path.parent / "sub").symlink_to(ws.outside, target_is_directory=True)
    return ws.args(model=path)


def _ext_nul_byte(ws: Workspace) -> list[str]:
    return ws.args(model=_ext(ws, "w.data\0../../etc/passwd"))


def _ext_bad_offset(ws: Workspace) -> list[str]:
    return ws.args(model=_ext(ws, offset="twelve"))


def _ext_short_length(ws: Workspace) -> list[str]:
    # offset/length inside the file, but 4 bytes for a 9216-byte tensor
    return ws.args(model=_ext(ws, length="4"))


def _ext_truncated_data(ws: Workspace) -> list[str]:
    path = _ext(ws)
    os.truncate(path.parent / "w.data", 100)
    return ws.args(model=path)


# -- calibration data
def _calib_missing(ws: Workspace) -> list[str]:
    return ws.args(calib=ws.root / "no-such-calib")


def _calib_empty(ws: Workspace) -> list[str]:
    (ws.root / "empty-calib").mkdir()
    return ws.args(calib=ws.root / "empty-calib")


def _calib_other_model(ws: Workspace) -> list[str]:
    return ws.args(calib=write_calib(ws.root / "c", batches(2, name="input_ids")))


def _calib_shape(ws: Workspace) -> list[str]:
    return ws.args(calib=write_calib(ws.root / "c", batches(2, shape=(1, 3, 8, 8))))


def _calib_int_for_float(ws: Workspace) -> list[str]:
    # uint8 pixels for a float model: the classic missing-preprocessing mistake
    ints = [{"x": np.full(INPUT_SHAPE, 200, dtype=np.int64)} for _ in range(2)]
    return ws.args(calib=write_calib(ws.root / "c", ints))


def _calib_value(value: float) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        items = batches(3)
        items[1]["x"][0, 3, 2, 1] = value
        return ws.args(calib=write_calib(ws.root / "c", items))

    return build


def _calib_f64_overflow(ws: Workspace) -> list[str]:
    # finite float64 values beyond float32's range
    items = [{"x": np.full(INPUT_SHAPE, 1e300, dtype=np.float64)}]
    return ws.args(calib=write_calib(ws.root / "c", items))


def _calib_corrupt_npz(ws: Workspace) -> list[str]:
    folder = ws.root / "c"
    folder.mkdir()
    (folder / "0000.npz").write_bytes(b"PK\x03\x04 definitely not a zip")
    return ws.args(calib=folder)


def _calib_object_array(ws: Workspace) -> list[str]:
    folder = ws.root / "c"
    folder.mkdir()
    np.savez(folder / "0000.npz", x=np.array([{"a": 1}, None], dtype=object))
    return ws.args(calib=folder)


# -- output
def _output_is_input(ws: Workspace) -> list[str]:
    return ws.args(out=ws.model)


def _output_folder_missing(ws: Workspace) -> list[str]:
    return ws.args(out=ws.out_dir / "missing" / "model.int8.onnx")


def _output_parent_is_file(ws: Workspace) -> list[str]:
    (ws.out_dir / "plain-file").write_text("x")
    return ws.args(out=ws.out_dir / "plain-file" / "model.int8.onnx")


def _report_folder_missing(ws: Workspace) -> list[str]:
    return ws.args(extra=("--report", str(ws.out_dir / "missing" / "report.json")))


# -- config
def _config(text: str) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        path = ws.root / "config.yaml"
        path.write_text(text)
        return ws.args(extra=("--config", str(path)))

    return build


def _config_missing(ws: Workspace) -> list[str]:
    return ws.args(extra=("--config", str(ws.root / "absent.yaml")))


CASES = [
    # model files
    Case("not-onnx-text", _text_file, r"not a readable ONNX", subprocess=True),
    Case("truncated-protobuf", _truncated, r"not a readable ONNX|truncated|complete"),
    Case("empty-file", _empty_file, r"no graph"),
    Case("undefined-tensor", _undefined_tensor, r"never_produced", subprocess=True),
    Case("custom-domain-op", _custom_domain, r"com\.example"),
    Case("opset-999", _opset_999, r"(?i)opset.*999", subprocess=True),
    Case("short-weight-payload", _short_weight_payload, r"conv\.weight"),
    Case("model-is-a-folder", _model_is_a_folder, r"is a folder, not a model file"),
    # external data
    Case("ext-missing-file", _ext_missing, r"w\.data.*not found", subprocess=True),
    Case("ext-dotdot-etc-passwd", _ext_dotdot_passwd, r"refused", refused=True, subprocess=True),
    Case("ext-dotdot-absent", _ext_dotdot_absent, r"refused", refused=True),
    Case("ext-absolute-absent", _ext_absolute_absent, r"refused", refused=True),
    Case("ext-absolute-existing", _ext_absolute_existing, r"refused", refused=True),
    Case("ext-symlink-absent", _ext_symlink_absent, r"refused", refused=True, subprocess=True),
    Case("ext-symlink-existing", _ext_symlink_existing, r"refused", refused=True),
    Case("ext-symlinked-subfolder", _ext_symlinked_folder, r"refused", refused=True),
    Case("ext-nul-byte-location", _ext_nul_byte, r"location", subprocess=True),
    Case("ext-non-integer-offset", _ext_bad_offset, r"offset"),
    Case("ext-length-shorter-than-tensor", _ext_short_length, r"length|bytes"),
    Case("ext-truncated-data-file", _ext_truncated_data, r"past the end"),
    # calibration data
    Case("calib-missing", _calib_missing, r"not found", subprocess=True),
    Case("calib-empty-folder", _calib_empty, r"no \.npz, \.npy or image files"),
    Case("calib-other-model-keys", _calib_other_model, r"input_ids"),
    Case("calib-shape-mismatch", _calib_shape, r"shape \[1, 3, 8, 8\]"),
    Case("calib-int-for-float", _calib_int_for_float, r"dtype int64", subprocess=True),
    Case("calib-nan", _calib_value(np.nan), r"batch 1.*NaN", subprocess=True),
    Case("calib-inf", _calib_value(-np.inf), r"batch 1.*Inf"),
    Case("calib-float64-overflow", _calib_f64_overflow, r"float32|range|Inf", subprocess=True),
    Case("calib-corrupt-npz", _calib_corrupt_npz, r"0000\.npz"),
    Case("calib-object-array", _calib_object_array, r"0000\.npz"),
    # output
    Case("output-is-input", _output_is_input, r"input model", subprocess=True),
    Case("output-folder-missing", _output_folder_missing, r"does not exist"),
    Case("output-parent-is-file", _output_parent_is_file, r"plain-file"),
    Case("report-folder-missing", _report_folder_missing, r"report|out/missing", subprocess=True),
    # config
    Case(
        "config-unknown-key",
        _config("backend: tensorrt\nbogus_key: 1\n"),
        r"bogus_key",
        subprocess=True,
    ),
    Case("config-wrong-type", _config("percentile: high\n"), r"percentile.*expected"),
    Case("config-list-for-bool", _config("simplify: [1, 2]\n"), r"simplify"),
    Case("config-invalid-yaml", _config("exclude: [\n"), r"YAML"),
    Case("config-missing", _config_missing, r"absent\.yaml"),
]


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (relative), symlinks not followed."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_one_line_error(code: int, err: str, keyword: str) -> str:
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1 and "\r" not in err, (
        f"stderr is not exactly one line: {err!r}"
    )
    line = err.rstrip("\n")
    assert line.startswith("onnxq: error: "), line
    assert re.search(keyword, line), f"{keyword!r} not in {line!r}"
    return line


def assert_nothing_written(ws: Workspace, before: set[str], case: Case) -> None:
    assert not ws.out.exists()
    leftovers = tree(ws.root) - before
    assert not leftovers, f"{case.id} left files behind: {sorted(leftovers)}"
    assert not [p for p in ws.root.rglob("*") if p.name.endswith(".tmp")]
    assert ws.model.read_bytes() == conv_model().SerializeToString()  # input untouched


def visible_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Warnings a plain ``python -m onnxq.cli`` run would print (not Deprecation*)."""
    hidden = (DeprecationWarning, PendingDeprecationWarning, ImportWarning)
    return [
        f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, hidden)
    ]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_a_one_line_user_error_that_writes_nothing(tmp_path, case, capfd, monkeypatch):
    ws = Workspace(tmp_path)
    argv = case.build(ws)
    before = tree(tmp_path)
    opened: list[str] = []
    if case.refused:
        # proof that nothing outside the model's folder is read: record every open(), and make
        # onnx's external-data loader itself fail loudly if it is reached
        real_open = builtins.open

        def recording_open(file, *args, **kwargs):
            opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else "")
            return real_open(file, *args, **kwargs)

        def no_reading(*args, **kwargs):
            raise AssertionError("external data was read before the location check")

        monkeypatch.setattr(builtins, "open", recording_open)
        monkeypatch.setattr(onnx, "load_external_data_for_model", no_reading)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["quantize", *argv, "-q"])
    monkeypatch.undo()
    out, err = capfd.readouterr()
    line = assert_one_line_error(code, err, case.keyword)
    assert out == ""
    assert not visible_warnings(caught), visible_warnings(caught)
    if case.refused:
        assert "not found" not in line
        touched = [
            p
            for p in opened
            if Path(p).name in ("w.data", "absent.data", "passwd") or ws.outside in Path(p).parents
        ]
        assert not touched, touched
    assert_nothing_written(ws, before, case)


SUBPROCESS_CASES = [c for c in CASES if c.subprocess]


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnxq.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[c.id for c in SUBPROCESS_CASES])
def test_bad_input_through_the_real_process(tmp_path, case):
    ws = Workspace(tmp_path)
    argv = case.build(ws)
    before = tree(tmp_path)
    proc = run_cli("quantize", *argv, "-q", cwd=tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, case.keyword)
    assert proc.stdout == ""
    assert_nothing_written(ws, before, case)


def test_user_error_after_progress_started_is_still_one_line(tmp_path):
    # no -q: the progress bar is on, stderr is a pipe (a CI log); the error must still be the
    # only line (tqdm should not draw on a non-terminal stream)
    ws = Workspace(tmp_path)
    argv = _calib_value(np.nan)(ws)
    proc = run_cli("quantize", *argv, cwd=tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, r"NaN")
    assert not ws.out.exists()


# ------------------------------------------------------------------------------- atomic save
def small_result(seed: int = 0) -> onnxq.QuantizedModel:
    """A quantized conv on 32x32 inputs: its 9 KB weight goes to external data when asked."""
    return onnxq.quantize(
        conv_model(size=32, seed=seed), batches(2, shape=(1, 16, 32, 32)), progress=False
    )


def failing_rename(monkeypatch, suffix: str, calls: list[str]) -> None:
    """``os.replace`` onto ``*suffix`` fails like a full disk; other renames go through."""
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        calls.append(os.fspath(dst))
        if os.fspath(dst).endswith(suffix):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_os_error_while_saving_is_an_output_error(tmp_path, monkeypatch, external):
    result = small_result()
    failing_rename(monkeypatch, ".onnx", [])
    with pytest.raises(onnxq.OutputError, match="No space left"):
        result.save(tmp_path / "m.onnx", external_data=external)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_previous_external_data_output_intact(tmp_path, monkeypatch):
    """Saving over an earlier output with external data: if the model's rename fails, the old
    ``.onnx`` must still describe the ``.data`` beside it (not point into a new data file)."""
    out = tmp_path / "model.int8.onnx"
    data = tmp_path / "model.int8.onnx.data"
    small_result(seed=0).save(out, external_data=True)
    first_model, first_data = out.read_bytes(), data.read_bytes()
    inputs = batches(1, shape=(1, 16, 32, 32), seed=5)[0]
    expected = ort.InferenceSession(str(out)).run(None, inputs)[0]

    other = small_result(seed=1)  # different weights, same tensor names and sizes
    calls: list[str] = []
    failing_rename(monkeypatch, ".onnx", calls)
    with pytest.raises(Exception, match="No space left"):
        other.save(out, external_data=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, data.name]
    assert out.read_bytes() == first_model
    assert data.read_bytes() == first_data, (
        "the previous model now reads the new weights; renames: " + ", ".join(calls)
    )
    got = ort.InferenceSession(str(out)).run(None, inputs)[0]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("external", [False, True])
def test_interrupt_inside_save_leaves_no_temp_files(tmp_path, monkeypatch, external):
    result = small_result()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        result.save(tmp_path / "m.onnx", external_data=external)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- interruption
SLOW_SIZE = 256  # 4 MB activations: ~50 ms per batch, 400 batches ~ 20 s


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory) -> tuple[Path, Path]:
    """A conv model on 1x16x256x256 inputs and 4000 calibration batches (hard links to one):
    minutes of calibration, so the signal always lands inside it."""
    root = tmp_path_factory.mktemp("slow")
    model = root / "big_activation.onnx"
    onnx.save(conv_model(size=SLOW_SIZE), str(model))
    calib = write_calib(root / "calib", batches(1, shape=(1, 16, SLOW_SIZE, SLOW_SIZE)))
    for i in range(1, 4000):
        os.link(calib / "0000.npz", calib / f"{i:04d}.npz")
    return model, calib


class TerminalOutput:
    """A pseudo-terminal for a child's stderr, read on a thread into ``text`` until the child
    closes it: onnxq's progress bar shows only on a terminal, and says when calibration runs
    (and a full terminal buffer would block the child)."""

    def __init__(self) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.master, self.child_end = pty.openpty()
        # a terminal has a size (tqdm draws nothing on one of 0 columns)
        fcntl.ioctl(self.child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        self._data = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        """Read from now on (once the child holds its end)."""
        os.close(self.child_end)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every holder of the child's end has closed it
                break
            if not chunk:
                break
            with self._lock:
                self._data += chunk

    @property
    def text(self) -> str:
        """What the child wrote so far."""
        with self._lock:
            return self._data.decode(errors="replace")

    def close(self) -> None:
        """Stop reading (the child has exited)."""
        self._reader.join(timeout=10)
        os.close(self.master)


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal and POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_quantize_leaves_nothing_behind(tmp_path, slow_job, signum):
    model, calib = slow_job
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    terminal = TerminalOutput()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onnxq.cli",
            "quantize",
            str(model),
            "-o",
            str(out_dir / "q.onnx"),
            "--calib",
            str(calib),
            "--report",
            str(out_dir / "r.json"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=terminal.child_end,
        env=env,
        cwd=tmp_path,
        # a shell's background job inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the child the default disposition, as a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    terminal.start()
    try:
        # ready when the progress bar says calibration runs (however long start-up takes on
        # a loaded machine); the limit only ends a run that never gets there
        deadline = time.monotonic() + 300
        while "calibrating" not in terminal.text:
            assert proc.poll() is None, terminal.text
            assert time.monotonic() < deadline, "calibration never started: " + terminal.text
            time.sleep(0.05)
        assert proc.poll() is None, "finished before it could be interrupted"
        proc.send_signal(signum)
        started = time.monotonic()
        code = proc.wait(timeout=20)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        terminal.close()
    stderr = terminal.text
    assert code != 0
    assert elapsed < 20
    assert "Traceback" not in stderr, stderr
    assert "interrupted" in stderr
    assert list(out_dir.iterdir()) == [], "output, report or temp files left behind"
    assert [p.name for p in tmpdir.iterdir() if p.name.startswith("onnxq-")] == []


# ------------------------------------------------------------------------------- determinism
def test_two_processes_write_byte_identical_model_and_report(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(two_conv_model(), str(model))
    calib = write_calib(tmp_path / "calib", batches(6, shape=(1, 16, 16, 16)))
    runs = {}
    for backend in ("tensorrt", "onnxruntime"):
        for run in ("a", "b"):
            folder = tmp_path / f"{backend}-{run}"
            folder.mkdir()
            runs[folder] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onnxq.cli",
                    "quantize",
                    str(model),
                    "-o",
                    str(folder / "q.onnx"),
                    "--calib",
                    str(calib),
                    "--backend",
                    backend,
                    "--method",
                    "entropy",
                    "--report",
                    str(folder / "report.json"),
                    "-q",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=tmp_path,
            )
    for proc in runs.values():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    for backend in ("tensorrt", "onnxruntime"):
        a, b = tmp_path / f"{backend}-a", tmp_path / f"{backend}-b"
        assert (a / "q.onnx").read_bytes() == (b / "q.onnx").read_bytes()
        assert (a / "report.json").read_bytes() == (b / "report.json").read_bytes()
        report = json.loads((a / "report.json").read_text())
        assert report["summary"]["quantized_ops"] >= 1


# ------------------------------------------------------------------------------- large models


def test_external_data_model_quantizes_and_saves_with_external_data(tmp_path):
    """The large-model path, scaled down: ~20 MB of weights in one external .data file."""
    builder = load_script("make_large_model")
    width = 1024
    src = tmp_path / "src"
    src.mkdir()
    model_path, data_path = builder.build_large_model(src / "stack.onnx", layers=5, width=width)
    assert 19 * 2**20 < data_path.stat().st_size < 22 * 2**20
    assert model_path.stat().st_size < 10_000  # the header holds no weights
    calib = batches(4, shape=(1, width), seed=3)
    result = onnxq.quantize(model_path, calib, backend="tensorrt", progress=False)
    out = tmp_path / "out" / "stack.int8.onnx"
    out.parent.mkdir()
    written = result.save(out, external_data=True)
    assert written == [out, out.with_name("stack.int8.onnx.data")]
    assert out.with_name("stack.int8.onnx.data").stat().st_size > 4 * 2**20
    assert out.stat().st_size < 1 * 2**20
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "stack.int8.onnx",
        "stack.int8.onnx.data",
    ]
    loaded = onnx.load(str(out))
    onnx.checker.check_model(loaded)
    assert check(loaded, PROFILES["tensorrt"]) == []
    assert sum(n.op_type == "DequantizeLinear" for n in loaded.graph.node) >= 10
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    for batch in calib[:2]:
        got = session.run(None, batch)[0]
        want = reference.run(None, batch)[0]
        assert np.linalg.norm(got - want) <= 0.1 * np.linalg.norm(want)
    # the source files are untouched and still self-consistent
    assert (
        onnx.load(str(model_path), load_external_data=False).graph.initializer[0].data_location
        == TensorProto.EXTERNAL
    )


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_weights_left_on_disk_quantize_to_the_same_bytes(tmp_path, monkeypatch, backend):
    """The >2 GB path at CI size: past ``LAZY_BYTES`` the weights stay in the input's data file
    (read one at a time, hard-linked for onnxruntime).  The output and report are byte for byte
    those of the run that reads the weights in; the inputs and the temp folder are untouched."""
    builder = load_script("make_large_model")
    src = tmp_path / "src"
    src.mkdir()
    model_path, data_path = builder.build_large_model(src / "stack.onnx", layers=5, width=256)
    inputs = (model_path, data_path)
    before = [(p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_nlink) for p in inputs]
    calib = write_calib(tmp_path / "calib", batches(4, shape=(1, 256), seed=3))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    links: list[str] = []
    real_link = ir.external.link_into

    def recording_link(source: str, target: Path) -> bool:
        links.append(source)
        return real_link(source, target)

    monkeypatch.setattr(ir.external, "link_into", recording_link)
    runs = []
    for lazy_bytes in (2**40, 2**20):  # read in; left on disk (the data file is 1.3 MB)
        monkeypatch.setattr(ir.external, "LAZY_BYTES", lazy_bytes)
        out = tmp_path / f"out-{lazy_bytes}"
        out.mkdir()
        code = main(
            [
                "quantize",
                str(model_path),
                "-o",
                str(out / "q.onnx"),
                "--calib",
                str(calib),
                "--report",
                str(out / "report.json"),
                "--backend",
                backend,
                "-q",
            ]
        )
        assert code == 0
        runs.append([(out / name).read_bytes() for name in ("q.onnx", "report.json")])
        assert sorted(p.name for p in out.iterdir()) == ["q.onnx", "report.json"]
    assert links and set(links) == {str(data_path.resolve())}  # the lazy run linked the data
    assert runs[0] == runs[1]
    report = json.loads(runs[1][1])
    assert report["summary"]["quantized_ops"] > 0
    assert report["fidelity"]["outputs"][0]["cosine"] > 0.99
    assert [(p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_nlink) for p in inputs] == before
    assert list(tmpdir.iterdir()) == []


# ------------------------------------------------------------------------------- code safety
def package_sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    return files


FORBIDDEN = [
    (
        re.compile(r"\bpickle\b|\bcPickle\b|\bdill\b|\bjoblib\b|\bshelve\b|\bmarshal\b"),
        "pickle-style deserialization",
    ),
    (re.compile(r"(?<![\w.])eval\s*\("), "eval("),
    (re.compile(r"(?<![\w.])exec\s*\("), "exec("),
    (re.compile(r"allow_pickle\s*=\s*True"), "allow_pickle=True"),
]


def test_package_never_unpickles_or_evaluates_code():
    hits = []
    for path in package_sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in FORBIDDEN:
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
    assert hits == []


def test_every_np_load_passes_allow_pickle_false():
    calls = []
    for path in package_sources():
        tree_ = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree_):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("numpy"):
                names = {a.name for a in node.names}
                assert not names & {"load", "*"}, f"{path}: from numpy import load hides calls"
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("np", "numpy")
            ):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            kw = {k.arg: k.value for k in node.keywords}
            value = kw.get("allow_pickle")
            ok = isinstance(value, ast.Constant) and value.value is False
            assert ok, f"{where}: np.load without allow_pickle=False"
            assert len(node.args) <= 2, f"{where}: allow_pickle passed positionally?"
            calls.append(where)
    assert calls, "no np.load found: the check would be vacuous"
