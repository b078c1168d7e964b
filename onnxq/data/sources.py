"""Calibration data sources.

Anything iterable that yields ``{input_name: np.ndarray}`` is a source.  From disk:

* a folder of ``.npz`` files, one batch per file, keys = model input names, read in file-name
  order;
* a folder of ``.npy`` files, for single-input models;
* one ``.npz`` whose arrays share a leading sample axis, cut into batches of ``batch_size``.

Files are read lazily, one batch at a time, with ``allow_pickle=False``.  A source read from
files also offers ``window(start, stop)``: its batches ``start:stop`` as a small source of their
own, which another process that sees the same files reads (a shard, ``onnxq.scale``).
"""

from __future__ import annotations

import copy
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.inputs import (
    model_inputs as model_inputs,  # re-exported: sources and inputs go together
)
from onnxq.errors import CalibrationDataError


class NpzFolder:
    """A folder of ``.npz`` (or ``.npy``) batches, in file-name order; re-iterable."""

    def __init__(self, folder: Path, inputs: list[InputSpec]):
        self.folder = folder
        npz = sorted(p for p in folder.iterdir() if p.suffix == ".npz" and p.is_file())
        npy = sorted(p for p in folder.iterdir() if p.suffix == ".npy" and p.is_file())
        if npz and npy:
            raise CalibrationDataError(
                f"{folder}: holds both .npz and .npy files; keep one kind per folder"
            )
        self.files = npz or npy
        if not self.files:
            raise CalibrationDataError(
                f"{folder}: no .npz, .npy or image files; give a folder of batches (NNNN.npz "
                "with one array per model input), a single .npz file, or a folder of jpg/png "
                "images with --preprocess"
            )
        if npy and len(inputs) != 1:
            raise CalibrationDataError(
                f"{folder}: .npy files carry one array, but the model has {len(inputs)} inputs "
                f"({', '.join(i.name for i in inputs)}); use .npz files keyed by input name"
            )
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Batch]:
        for path in self.files:
            yield _read_batch(path, self.inputs)

    def window(self, start: int, stop: int) -> NpzFolder:
        """Batches ``start:stop`` as a source of their own: a small value (file names) that
        any process seeing the same files reads (:mod:`onnxq.scale`)."""
        part = copy.copy(self)
        part.files = self.files[start:stop]
        return part


class NpzSamples:
    """One ``.npz`` whose arrays share a leading sample axis, cut into batches."""

    def __init__(self, path: Path, inputs: list[InputSpec], batch_size: int):
        self.path = path
        self.batch_size = batch_size
        self.arrays = _load_arrays(path)
        lengths = {k: len(v) for k, v in self.arrays.items() if v.ndim > 0}
        if not lengths or len(set(lengths.values())) != 1:
            raise CalibrationDataError(
                f"{path}: arrays must share a leading sample axis; got lengths {lengths}"
            )
        self.samples = next(iter(lengths.values()))
        self.inputs = inputs

    def __len__(self) -> int:
        return (self.samples + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[Batch]:
        for start in range(0, self.samples, self.batch_size):
            yield {k: v[start : start + self.batch_size] for k, v in self.arrays.items()}


def _holds_images(folder: Path) -> bool:
    from onnxq.data.images import IMAGE_EXTENSIONS

    has_arrays = any(p.suffix in (".npz", ".npy") for p in folder.iterdir())
    return not has_arrays and any(p.suffix.lower() in IMAGE_EXTENSIONS for p in folder.iterdir())


def _image_folder(
    folder: Path, inputs: list[InputSpec], batch_size: int, preprocess: str | None
) -> Iterable[Batch]:
    from onnxq.data.images import PRESETS, ImageFolder, Preprocess

    if preprocess is None:
        raise CalibrationDataError(
            f"{folder}: holds images; say how to turn them into model inputs with --preprocess "
            f"(presets: {', '.join(PRESETS)}; see docs/calibration.md)"
        )
    if len(inputs) != 1:
        raise CalibrationDataError(
            f"{folder}: an image folder feeds one input, the model has {len(inputs)} "
            f"({', '.join(i.name for i in inputs)}); use .npz batches"
        )
    return ImageFolder(folder, inputs[0], Preprocess.from_spec(preprocess), batch_size)


_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """All arrays of a ``.npz`` (keys as stored) or ``.npy`` (key ""), without pickles.

    The file is opened here and always closed, also when numpy fails half-way through a
    corrupt archive.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)  # neither .npy nor zip (.npz): numpy would try to unpickle it
            if not (head == b"\x93NUMPY" or head[:4] in (b"PK\x03\x04", b"PK\x05\x06")):
                raise CalibrationDataError(
                    f"{path}: not a numpy file (.npy or .npz); the file is corrupt or holds "
                    "something else"
                )
            fh.seek(0)
            loaded = np.load(fh, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return {"": loaded}
            with loaded:
                return {k: loaded[k] for k in loaded.files}
    except _READ_ERRORS as exc:
        if "allow_pickle" in str(exc):
            raise CalibrationDataError(
                f"{path}: holds an object array (strings or Python objects), which numpy can "
                "only load by unpickling, and onnxq refuses pickled data; give numeric arrays, "
                "or numpy text arrays (np.array(['...'])) for a string input"
            ) from None
        raise CalibrationDataError(
            f"{path}: cannot read as .npz/.npy ({type(exc).__name__}: {exc}); the file is "
            "corrupt or not a numpy file (pickled arrays are refused)"
        ) from None


def _read_batch(path: Path, inputs: list[InputSpec]) -> Batch:
    arrays = _load_arrays(path)
    if path.suffix == ".npy":
        return {inputs[0].name: arrays[""]}
    return arrays


def open_source(
    source: Any, inputs: list[InputSpec], batch_size: int = 1, preprocess: str | None = None
) -> Iterable[Batch]:
    """Turn a path, a mapping or an iterable into an iterable of batches.

    A folder of images (jpg/png/...) needs ``preprocess``, a spec for
    :meth:`onnxq.data.images.Preprocess.from_spec` (e.g. ``imagenet``).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise CalibrationDataError(f"batch size must be an integer >= 1, got {batch_size!r}")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise CalibrationDataError(f"calibration data not found: {path}")
        if path.is_dir():
            images = _holds_images(path)
            if (
                preprocess is not None
                and not images
                and (any(path.glob("*.npz")) or any(path.glob("*.npy")))
            ):
                raise CalibrationDataError(
                    f"{path} holds .npz/.npy batches, which are fed as they are, but a "
                    f"preprocess spec ({preprocess}) was given: it applies to image folders "
                    "only; drop --preprocess (or the config's preprocess) for array data"
                )
            if preprocess is not None or images:
                return _image_folder(path, inputs, batch_size, preprocess)
            return NpzFolder(path, inputs)
        if path.suffix == ".npz":
            return NpzSamples(path, inputs, batch_size)
        if path.suffix == ".npy" and len(inputs) == 1:
            arr = _read_batch(path, inputs)[inputs[0].name]
            return [
                {inputs[0].name: arr[i : i + batch_size]} for i in range(0, len(arr), batch_size)
            ]
        raise CalibrationDataError(
            f"{path}: unsupported calibration data; give a folder of .npz/.npy batches or one "
            ".npz file with a leading sample axis"
        )
    if isinstance(source, Mapping):
        return [dict(source)]
    if isinstance(source, Iterable):
        return source
    raise CalibrationDataError(
        f"calibration data of type {type(source).__name__} is not supported; give a path or an "
        "iterable of {input_name: numpy array}"
    )


def check_batch(batch: Any, inputs: list[InputSpec], index: int) -> Batch:
    """Validate one batch against the model's inputs; returns it with matching dtypes."""
    where = f"calibration batch {index}"
    if not isinstance(batch, Mapping):
        raise CalibrationDataError(
            f"{where}: expected a dict {{input_name: array}}, got {type(batch).__name__}"
        )
    names = {i.name for i in inputs}
    unknown = sorted(set(batch) - names)
    missing = sorted(names - set(batch))
    if unknown or missing:
        raise CalibrationDataError(
            f"{where}: input names do not match the model: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"unknown {unknown}" if unknown else "")
            + f" (the model's inputs: {sorted(names)})"
        )
    out: Batch = {}
    for spec in inputs:
        arr = np.asarray(batch[spec.name])
        if arr.dtype != spec.dtype:
            arr = _cast(arr, spec, where)
        if spec.shape is not None:
            _check_shape(arr, spec, where)
        if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
            raise CalibrationDataError(
                f"{where}: input {spec.name!r} contains NaN or Inf; clean the data"
            )
        out[spec.name] = arr
    return out


def _cast(arr: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    """Cast within a kind (float64 -> float32, int32 -> int64); refuse kind changes."""
    want = spec.dtype
    if want.kind == "O" and arr.dtype.kind in "US":  # numpy text for a string input: .npz
        return arr.astype(object)  # files hold text only this way
    if arr.dtype.kind != want.kind and not (arr.dtype.kind in "iu" and want.kind in "iu"):
        hint = (
            " (raw pixels or token ids? apply the model's preprocessing)"
            if want.kind == "f"
            else ""
        )
        raise CalibrationDataError(
            f"{where}: input {spec.name!r} has dtype {arr.dtype}, the model expects {want}{hint}"
        )
    if arr.dtype.kind == "f" and arr.size:
        if not np.isfinite(arr).all():
            raise CalibrationDataError(
                f"{where}: input {spec.name!r} contains NaN or Inf; clean the data"
            )
        limit = np.finfo(want).max
        if np.abs(arr).max() > limit:
            raise CalibrationDataError(
                f"{where}: input {spec.name!r} has values beyond the {want} range "
                f"(|x| up to {float(np.abs(arr).max()):.3g}); rescale the data"
            )
    with np.errstate(all="ignore"):
        return arr.astype(want)


def _check_shape(arr: np.ndarray, spec: InputSpec, where: str) -> None:
    assert spec.shape is not None
    ok = arr.ndim == len(spec.shape) and all(
        not isinstance(d, int) or d <= 0 or d == got
        for d, got in zip(spec.shape, arr.shape, strict=False)
    )
    if not ok:
        expected = (
            "["
            + ", ".join("?" if not isinstance(d, int) or d <= 0 else str(d) for d in spec.shape)
            + "]"
        )
        raise CalibrationDataError(
            f"{where}: input {spec.name!r} has shape {list(arr.shape)}, the model expects "
            f"{expected}"
        )


def batches_total(source: Iterable[Batch]) -> int | None:
    """The number of batches, if the source knows it."""
    try:
        return len(source)  # type: ignore[arg-type]
    except TypeError:
        return None
