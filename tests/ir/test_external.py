"""Lazy weights (``onnxq.ir.external``): large external data stays on disk until read.

``LAZY_BYTES`` is lowered to 1 KiB here, so tiny models take the path a multi-GB model takes.
Every writer must give exactly the bytes the eagerly loaded model gives.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq import ir
from onnxq.errors import ModelLoadError
from onnxq.ir import external
from tests import graphs


@pytest.fixture
def lazy(monkeypatch):
    """Every model with 1 KiB of external data or more loads lazily."""
    monkeypatch.setattr(external, "LAZY_BYTES", 1024)


def mixed_types() -> onnx.ModelProto:
    """Gemm (float weight and bias) -> Add (float16 -> float constant via Cast) -> Reshape
    (int64 shape): weights of several element types, big enough for external data."""
    r = graphs.rng(1)
    w = graphs.weight(r, 64, 32)
    b = graphs.weight(r, 64)
    half = graphs.weight(r, 64).astype(np.float16)
    shape = np.array([1, 8, 8], dtype=np.int64)  # small: read in even when lazy
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="gemm", transB=1),
        helper.make_node("Cast", ["half"], ["half_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["g", "half_f"], ["a"], name="add"),
        helper.make_node("Reshape", ["a", "shape"], ["y"], name="reshape"),
    ]
    inits = [
        graphs.init("w", w),
        graphs.init("b", b),
        graphs.init("half", half),
        graphs.init("shape", shape),
    ]
    return graphs.model(
        nodes, [graphs.tensor("x", [1, 32])], [graphs.tensor("y", [1, 8, 8])], inits
    )


def save_external(model: onnx.ModelProto, folder: Path, name: str = "m.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def eager(path: Path, monkeypatch) -> onnx.ModelProto:
    with monkeypatch.context() as m:
        m.setattr(external, "LAZY_BYTES", 2**40)
        return ir.load_model(path)


# ------------------------------------------------------------------------------- loading
def test_large_external_data_stays_on_disk(tmp_path, lazy, monkeypatch):
    path = save_external(mixed_types(), tmp_path / "src")
    model = ir.load_model(path)
    tensors = {t.name: t for t in model.graph.initializer}
    assert all(external.is_lazy(t) for t in tensors.values())
    assert all(not t.raw_data for t in tensors.values())
    data = (tmp_path / "src" / "weights.bin").resolve()
    assert {external.extent(t).path for t in tensors.values()} == {str(data)}
    assert ir.inline_nbytes(model) < ir.model_nbytes(model)
    full = eager(path, monkeypatch)
    assert not external.has_lazy(full)
    g_lazy, g_full = ir.Graph(model), ir.Graph(full)
    for name in tensors:
        got, want = g_lazy.const_value(name), g_full.const_value(name)
        assert got is not None and want is not None
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable


def test_small_external_data_is_read_in(tmp_path):
    path = save_external(mixed_types(), tmp_path)
    model = ir.load_model(path)  # ~9 KB, far below the default LAZY_BYTES
    assert not external.has_lazy(model)
    assert all(t.data_location == TensorProto.DEFAULT for t in model.graph.initializer)


def test_lazy_tensor_whose_length_disagrees_with_its_shape_is_refused(tmp_path, lazy):
    path = save_external(mixed_types(), tmp_path)
    header = onnx.load(str(path), load_external_data=False)
    w = next(t for t in header.graph.initializer if t.name == "w")
    for e in w.external_data:
        if e.key == "length":
            e.value = str(int(e.value) - 4)
    path.write_bytes(header.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"'w' holds \d+ bytes"):
        ir.load_model(path)


def test_lazy_location_outside_the_folder_is_refused_before_reading(tmp_path, lazy, monkeypatch):
    outside = save_external(mixed_types(), tmp_path / "outside")
    folder = tmp_path / "model"
    folder.mkdir()
    header = onnx.load(str(outside), load_external_data=False)
    for t in header.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside/weights.bin"
    (folder / "m.onnx").write_bytes(header.SerializeToString())

    def no_reading(*args, **kwargs):
        raise AssertionError("weights were read before the location check")

    monkeypatch.setattr(external, "make_lazy", no_reading)
    with pytest.raises(ModelLoadError, match="leaves the model's folder"):
        ir.load_model(folder / "m.onnx")


def test_reading_a_lazy_tensor_whose_file_shrank_is_a_load_error(tmp_path, lazy):
    path = save_external(mixed_types(), tmp_path)
    model = ir.load_model(path)
    data = tmp_path / "weights.bin"
    data.write_bytes(data.read_bytes()[:100])
    w = next(t for t in model.graph.initializer if t.name == "w")
    with pytest.raises(ModelLoadError, match="shorter than when the model was loaded"):
        ir.Graph(model).const_value("w")
    with pytest.raises(ModelLoadError, match="shorter than when the model was loaded"):
        external.read_bytes(w)


# ------------------------------------------------------------------------------- writing
def test_serialize_and_save_give_the_eager_bytes(tmp_path, lazy, monkeypatch):
    path = save_external(mixed_types(), tmp_path / "src")
    model, full = ir.load_model(path), eager(path, monkeypatch)
    assert ir.serialize(model) == ir.serialize(full)
    header = ir.serialize(model, load_lazy=False)
    assert len(header) < 2000 and external.has_lazy(onnx.load_from_string(header))

    out = tmp_path / "out"
    out.mkdir()
    for external_data in (False, True):
        a = ir.save_model(model, out / f"lazy-{external_data}.onnx", external_data)
        b = ir.save_model(full, out / f"full-{external_data}.onnx", external_data)
        assert [p.read_bytes() for p in a][1:] == [p.read_bytes() for p in b][1:]
        header_a = onnx.load(str(a[0]), load_external_data=False)
        header_b = onnx.load(str(b[0]), load_external_data=False)
        if external_data:  # the headers differ only in the data file's name
            for t in header_a.graph.initializer:
                for e in t.external_data:
                    if e.key == "location":
                        e.value = e.value.replace("lazy-", "full-")
        assert header_a.SerializeToString() == header_b.SerializeToString()
    # by default a model with weights on disk is saved with external data
    written = ir.save_model(model, out / "auto.onnx")
    assert [p.name for p in written] == ["auto.onnx", "auto.onnx.data"]
    assert external.has_lazy(model)  # saving read nothing into the model


def test_onnxruntime_reads_lazy_weights_through_a_link(tmp_path, lazy, monkeypatch):
    src = save_external(mixed_types(), tmp_path / "src")
    data = tmp_path / "src" / "weights.bin"
    before = data.read_bytes(), data.stat().st_mtime_ns
    model, full = ir.load_model(src), eager(src, monkeypatch)
    x = {"x": graphs.rng(3).standard_normal((1, 32)).astype(np.float32)}
    want = ort.InferenceSession(ir.serialize(full)).run(None, x)[0]

    work = tmp_path / "work"
    work.mkdir()
    payload = ir.session_bytes_or_path(model, work)
    assert isinstance(payload, str)
    links = sorted(p for p in work.iterdir() if ".src" in p.name)
    assert len(links) == 1 and os.path.samefile(links[0], data)  # a link, not a copy
    assert (work / "model.onnx.data").stat().st_size == 0
    got = ort.InferenceSession(payload, providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_array_equal(got, want)
    for p in work.iterdir():
        p.unlink()
    assert (data.read_bytes(), data.stat().st_mtime_ns) == before
    assert data.stat().st_nlink == 1


def test_onnxruntime_gets_a_copy_when_the_link_is_refused(tmp_path, lazy, monkeypatch):
    src = save_external(mixed_types(), tmp_path / "src")
    model = ir.load_model(src)
    monkeypatch.setattr(external, "link_into", lambda source, target: False)
    work = tmp_path / "work"
    work.mkdir()
    payload = ir.session_bytes_or_path(model, work)
    assert sorted(p.name for p in work.iterdir()) == ["model.onnx", "model.onnx.data"]
    x = {"x": np.ones((1, 32), dtype=np.float32)}
    got = ort.InferenceSession(payload, providers=["CPUExecutionProvider"]).run(None, x)[0]
    full = eager(src, monkeypatch)
    want = ort.InferenceSession(ir.serialize(full)).run(None, x)[0]
    np.testing.assert_array_equal(got, want)


def test_load_all_reads_lazy_weights_in_like_onnx(tmp_path, lazy, monkeypatch):
    path = save_external(mixed_types(), tmp_path)
    model = ir.load_model(path)
    assert external.lazy_nbytes(model) > 64 * 32 * 4
    external.load_all(model)
    assert not external.has_lazy(model) and external.lazy_nbytes(model) == 0
    assert model.SerializeToString() == eager(path, monkeypatch).SerializeToString()


def test_a_file_cannot_declare_a_lazy_tensor(tmp_path, lazy):
    """Lazy means an absolute location; loading refuses those, so only onnxq makes them."""
    path = save_external(mixed_types(), tmp_path)
    header = onnx.load(str(path), load_external_data=False)
    for t in header.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = str(tmp_path / "weights.bin")
    path.write_bytes(header.SerializeToString())
    with pytest.raises(ModelLoadError, match="absolute path"):
        ir.load_model(path)


def test_graph_edits_keep_one_copy_of_each_weight():
    model = graphs.gemm()
    graph = ir.Graph(model)
    name = graph.add_initializer("extra", np.arange(6, dtype=np.float32))
    assert graph.initializers[name] is not None
    graph.initializers[name].raw_data = np.zeros(6, np.float32).tobytes()
    # the index holds the graph's own tensor, so an edit through it is an edit of the model
    stored = next(t for t in model.graph.initializer if t.name == "extra")
    np.testing.assert_array_equal(numpy_helper.to_array(stored), np.zeros(6, np.float32))
    before = [t.name for t in model.graph.initializer if t.name != "extra"]
    graph.commit()  # "extra" feeds nothing: dropped, the others keep their order
    assert [t.name for t in model.graph.initializer] == before


def test_a_large_in_memory_model_reaches_onnxruntime_as_a_file(tmp_path, lazy):
    """From LAZY_BYTES on, onnxruntime maps the weights from a file: no serialized copy."""
    model = mixed_types()
    x = {"x": np.ones((1, 32), dtype=np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    payload = ir.session_bytes_or_path(model, tmp_path)
    assert payload == str(tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx.data").stat().st_size >= 64 * 32 * 4
    got = ort.InferenceSession(payload, providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_array_equal(got, want)
