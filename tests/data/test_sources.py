"""Calibration data sources and batch validation."""

from __future__ import annotations

import numpy as np
import pytest

import onnxq
from onnxq import ir
from onnxq.data.sources import (
    InputSpec,
    NpzFolder,
    NpzSamples,
    batches_total,
    check_batch,
    model_inputs,
    open_source,
)
from onnxq.errors import CalibrationDataError, OnnxqError
from tests import graphs

X = InputSpec("x", np.dtype("float32"), (1, 16, 8, 8))
DYNAMIC = InputSpec("x", np.dtype("float32"), ("N", 16, 64))


def batch(shape=(1, 16, 8, 8), dtype=np.float32, name="x") -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(0).standard_normal(shape).astype(dtype)}


# ------------------------------------------------------------------------------- sources
def test_model_inputs_reads_names_dtypes_and_shapes():
    model = ir.infer_shapes(graphs.if_model())
    specs = model_inputs(ir.Graph(model))
    assert [(s.name, s.dtype, s.shape) for s in specs] == [
        ("x", np.dtype("float32"), (1, 16, 8, 8)),
        ("cond", np.dtype("bool"), ()),
    ]
    (spec,) = model_inputs(ir.Graph(ir.infer_shapes(graphs.shape_subgraph())))
    assert spec.shape == ("N", 16, 64)


def test_folder_of_npz_is_read_in_file_name_order_and_is_reiterable(calib_dir):
    folder = calib_dir(graphs.conv_relu(), n=3)
    (folder / "notes.txt").write_text("ignored")
    source = open_source(folder, [X])
    assert isinstance(source, NpzFolder) and len(source) == 3
    assert [p.name for p in source.files] == ["0000.npz", "0001.npz", "0002.npz"]
    first, again = list(source), list(source)
    expected = graphs.random_batches(graphs.conv_relu(), 3)
    for got, want, repeat in zip(first, expected, again, strict=True):
        np.testing.assert_array_equal(got["x"], want["x"])
        np.testing.assert_array_equal(repeat["x"], want["x"])


def test_folder_of_npy_for_a_single_input(tmp_path):
    for i in range(2):
        np.save(tmp_path / f"{i:04d}.npy", batch()["x"])
    batches = list(open_source(tmp_path, [X]))
    assert len(batches) == 2 and set(batches[0]) == {"x"}


def test_npy_folder_needs_a_single_input_model(tmp_path):
    np.save(tmp_path / "0000.npy", batch()["x"])
    two = [X, InputSpec("y", np.dtype("float32"), None)]
    with pytest.raises(CalibrationDataError, match=r"\.npy files carry one array.*x, y"):
        open_source(tmp_path, two)


def test_mixed_folder_is_refused(tmp_path):
    np.save(tmp_path / "a.npy", batch()["x"])
    np.savez(tmp_path / "b.npz", **batch())
    with pytest.raises(CalibrationDataError, match=r"both \.npz and \.npy"):
        open_source(tmp_path, [X])


def test_single_npz_of_samples_is_cut_into_batches(tmp_path):
    path = tmp_path / "samples.npz"
    np.savez(path, x=np.arange(10 * 4, dtype=np.float32).reshape(10, 4))
    source = open_source(path, [InputSpec("x", np.dtype("float32"), ("N", 4))], batch_size=4)
    assert isinstance(source, NpzSamples) and len(source) == 3
    sizes = [b["x"].shape[0] for b in source]
    assert sizes == [4, 4, 2]
    assert batches_total(source) == 3


def test_single_npy_of_samples_is_cut_into_batches(tmp_path):
    path = tmp_path / "samples.npy"
    np.save(path, np.zeros((5, 4), np.float32))
    source = open_source(path, [InputSpec("x", np.dtype("float32"), ("N", 4))], batch_size=2)
    assert [b["x"].shape[0] for b in source] == [2, 2, 1]


@pytest.mark.parametrize("batch_size", [0, -2])
def test_batch_size_below_one_is_a_user_error(tmp_path, batch_size):
    path = tmp_path / "samples.npz"
    np.savez(path, x=np.zeros((5, 4), np.float32))
    spec = InputSpec("x", np.dtype("float32"), ("N", 4))
    with pytest.raises(OnnxqError, match="batch"):
        source = open_source(path, [spec], batch_size=batch_size)
        batches_total(source)
        list(source)


def test_mappings_and_iterables_are_sources():
    one = batch()
    assert open_source(one, [X]) == [one]
    batches = [batch(), batch()]
    assert open_source(batches, [X]) is batches
    assert batches_total(iter(batches)) is None


def test_unsupported_source_types_raise():
    with pytest.raises(CalibrationDataError, match="of type int is not supported"):
        open_source(42, [X])


def test_samples_npz_needs_a_shared_leading_axis(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    with pytest.raises(CalibrationDataError, match="share a leading sample axis"):
        open_source(path, [X])


# ------------------------------------------------------------------------------- errors
def test_missing_folder(tmp_path):
    with pytest.raises(CalibrationDataError, match="calibration data not found"):
        open_source(tmp_path / "nope", [X])


def test_empty_folder(tmp_path):
    with pytest.raises(
        CalibrationDataError,
        match=r"no \.npz, \.npy or image files; .* "
        r"images with --preprocess",
    ):
        open_source(tmp_path, [X])


def test_unsupported_file_type(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("1,2,3")
    with pytest.raises(CalibrationDataError, match="unsupported calibration data"):
        open_source(path, [X])


def test_corrupt_npz_file(tmp_path):
    # neither a zip nor .npy: numpy would try to unpickle it, which is not what is wrong
    (tmp_path / "0000.npz").write_bytes(b"not a zip file")
    with pytest.raises(CalibrationDataError, match=r"0000\.npz: not a numpy file"):
        list(open_source(tmp_path, [X]))


def test_pickled_object_arrays_are_refused(tmp_path):
    np.savez(tmp_path / "0000.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(
        CalibrationDataError,
        match=r"0000\.npz: holds an object array .* "
        "onnxq refuses pickled data",
    ):
        list(open_source(tmp_path, [X]))


def test_wrong_input_name_lists_the_model_inputs():
    with pytest.raises(CalibrationDataError) as info:
        check_batch(batch(name="input_1"), [X], 3)
    message = str(info.value)
    assert "calibration batch 3" in message
    assert "missing ['x']" in message and "unknown ['input_1']" in message


def test_wrong_shape_names_the_input():
    with pytest.raises(
        CalibrationDataError,
        match=r"input 'x' has shape \[1, 3, 8, 8\], the model expects "
        r"\[1, 16, 8, 8\]",
    ):
        check_batch(batch((1, 3, 8, 8)), [X], 0)
    with pytest.raises(CalibrationDataError, match="input 'x' has shape"):
        check_batch(batch((16, 8, 8)), [X], 0)


def test_symbolic_dimensions_accept_any_size():
    for n in (1, 5):
        out = check_batch(batch((n, 16, 64)), [DYNAMIC], 0)
        assert out["x"].shape == (n, 16, 64)
    with pytest.raises(CalibrationDataError, match=r"the model expects \[\?, 16, 64\]"):
        check_batch(batch((2, 16, 63)), [DYNAMIC], 0)


def test_wrong_dtype_names_the_input():
    with pytest.raises(CalibrationDataError, match="input 'x' has dtype complex64"):
        check_batch(batch(dtype=np.complex64), [X], 0)
    ints = InputSpec("ids", np.dtype("int64"), (4,))
    with pytest.raises(CalibrationDataError, match="input 'ids' has dtype float32"):
        check_batch({"ids": np.zeros(4, np.float32)}, [ints], 0)


def test_same_kind_dtypes_are_cast_to_the_model_dtype():
    out = check_batch(batch(dtype=np.float64), [X], 0)
    assert out["x"].dtype == np.float32


def test_numpy_text_feeds_a_string_input():
    # a .npz holds text as a numpy unicode array (object arrays need pickles, refused);
    # onnxruntime takes strings as object arrays
    text = InputSpec("text", np.dtype(object), (None,))
    out = check_batch({"text": np.array(["monday", "tuesday"])}, [text], 0)
    assert out["text"].dtype == object and list(out["text"]) == ["monday", "tuesday"]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_an_input_names_the_input(bad):
    data = batch()
    data["x"][0, 0, 0, 0] = bad
    with pytest.raises(CalibrationDataError, match="batch 1: input 'x' contains NaN or Inf"):
        check_batch(data, [X], 1)


def test_batch_must_be_a_mapping():
    with pytest.raises(CalibrationDataError, match="expected a dict"):
        check_batch([np.zeros(3)], [X], 0)


# ------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "missing", "calibration data not found"),
        (lambda d: d, "no .npz, .npy or image files"),
    ],
)
def test_quantize_reports_folder_errors(tmp_path, model_file, make, match):
    folder = tmp_path / "calib"
    folder.mkdir()
    with pytest.raises(CalibrationDataError, match=match):
        onnxq.quantize(model_file(graphs.conv_relu()), make(folder), progress=False)


def test_quantize_reports_nan_with_the_input_name(tmp_path, model_file):
    folder = tmp_path / "calib"
    folder.mkdir()
    data = batch()
    data["x"][0, 1, 2, 3] = np.nan
    np.savez(folder / "0000.npz", **data)
    with pytest.raises(CalibrationDataError, match="input 'x' contains NaN"):
        onnxq.quantize(model_file(graphs.conv_relu()), folder, progress=False)
