"""Lazy weights: initializers whose bytes stay in the input model's external data file.

:func:`onnxq.ir.load_model` leaves the external data of a large model (:data:`LAZY_BYTES` or
more) on disk.  Each such top-level initializer keeps ``data_location = EXTERNAL``; its
``location`` becomes the absolute path of its data file, resolved and checked (inside the
model's folder, in bounds, length matching shape and type) before a byte of it is read.  Such a
tensor is *lazy*: its values are read one tensor at a time when asked for
(:func:`tensor_array`), an output copies its byte range (:func:`copy_bytes`), and onnxruntime
reads it from a link of the data file beside the session's model (:func:`link_into`), so the
float weights are never all in this process's memory at once.

A model file cannot smuggle a lazy tensor in: loading refuses absolute locations.  Lazy
tensors exist only in memory, and every writer in ``onnxq.ir`` turns them back into bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.errors import ModelLoadError

# external data at least this large stays on disk (a smaller model is simply read in)
LAZY_BYTES = 256 * 2**20
_CHUNK = 16 * 2**20
# element types read straight from the file (little-endian, one numpy dtype per element)
_PLAIN_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.BOOL,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


@dataclass(frozen=True)
class Extent:
    """Where a lazy tensor's bytes are: an absolute file path, an offset and a length."""

    path: str
    offset: int
    length: int


def make_lazy(tensor: TensorProto, path: Path, offset: int, length: int) -> None:
    """Point ``tensor`` at ``length`` bytes at ``offset`` of the (already checked) ``path``."""
    del tensor.external_data[:]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=str(path))
    tensor.external_data.add(key="offset", value=str(offset))
    tensor.external_data.add(key="length", value=str(length))


def is_lazy(tensor: TensorProto) -> bool:
    """True for an initializer whose data stays in a checked file (see the module doc)."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return False
    for entry in tensor.external_data:
        if entry.key == "location":
            return os.path.isabs(entry.value)
    return False


def extent(tensor: TensorProto) -> Extent:
    """The file range of a lazy tensor."""
    info = {e.key: e.value for e in tensor.external_data}
    return Extent(info["location"], int(info.get("offset", 0)), int(info["length"]))


def lazy_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """The lazy initializers of the top-level graph."""
    return (t for t in model.graph.initializer if is_lazy(t))


def has_lazy(model: onnx.ModelProto) -> bool:
    """True when some initializer's data is still on disk."""
    return any(True for _ in lazy_tensors(model))


def lazy_nbytes(model: onnx.ModelProto) -> int:
    """Bytes of weights still on disk."""
    return sum(extent(t).length for t in lazy_tensors(model))


def read_bytes(tensor: TensorProto) -> bytes:
    """The stored bytes of a lazy tensor."""
    ext = extent(tensor)
    try:
        with open(ext.path, "rb") as fh:
            fh.seek(ext.offset)
            data = fh.read(ext.length)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot read the weights of {tensor.name!r} from {ext.path}: {exc.strerror or exc}"
        ) from None
    if len(data) != ext.length:
        raise _changed(tensor, ext)
    return data


def tensor_array(tensor: TensorProto) -> np.ndarray:
    """The value of any initializer; a lazy one is read from its file (one copy)."""
    if not is_lazy(tensor):
        return numpy_helper.to_array(tensor)
    if tensor.data_type not in _PLAIN_TYPES:
        return numpy_helper.to_array(loaded_copy(tensor))
    ext = extent(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    count = ext.length // dtype.itemsize
    try:
        values = np.fromfile(ext.path, dtype=dtype, count=count, offset=ext.offset)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot read the weights of {tensor.name!r} from {ext.path}: {exc.strerror or exc}"
        ) from None
    if values.size != count:
        raise _changed(tensor, ext)
    return values.astype(dtype.newbyteorder("="), copy=False).reshape(tuple(tensor.dims))


def loaded_copy(tensor: TensorProto) -> TensorProto:
    """A copy of a lazy tensor with its bytes inline, exactly as onnx's own external-data
    loader leaves a tensor (``raw_data`` set, ``data_location`` DEFAULT, no external_data)."""
    out = TensorProto()
    out.CopyFrom(tensor)
    out.raw_data = read_bytes(tensor)
    out.data_location = TensorProto.DEFAULT
    del out.external_data[:]
    return out


def load_all(model: onnx.ModelProto) -> None:
    """Read every lazy initializer of ``model`` into memory (in place)."""
    for tensor in model.graph.initializer:
        if is_lazy(tensor):
            tensor.CopyFrom(loaded_copy(tensor))


def copy_bytes(tensor: TensorProto, out: BinaryIO) -> int:
    """Append a lazy tensor's bytes to ``out`` in chunks; returns the count."""
    ext = extent(tensor)
    left = ext.length
    try:
        with open(ext.path, "rb") as fh:
            fh.seek(ext.offset)
            while left:
                chunk = fh.read(min(left, _CHUNK))
                if not chunk:
                    raise _changed(tensor, ext)
                out.write(chunk)
                left -= len(chunk)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot read the weights of {tensor.name!r} from {ext.path}: {exc.strerror or exc}"
        ) from None
    return ext.length


def link_into(source: str, target: Path) -> bool:
    """Make ``target`` a hard link of ``source`` (no bytes copied); False when the filesystem
    refuses (another device, protected links), and the caller copies the bytes instead."""
    try:
        os.link(source, target)
    except OSError:
        return False
    return True


def _changed(tensor: TensorProto, ext: Extent) -> ModelLoadError:
    return ModelLoadError(
        f"the external data of {tensor.name!r} ({ext.path}, {ext.length} bytes at offset "
        f"{ext.offset}) is shorter than when the model was loaded; was the file changed while "
        "onnxq ran?"
    )
