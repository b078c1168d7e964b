"""Reading a large model file without reading its inline weights.

``onnx.load`` reads the whole file and then parses it: a model whose weights are stored inside
the ``.onnx`` file costs twice its size in memory while it loads.  :func:`read_light` walks the
protobuf wire format of the file instead (memory-mapped, so only the pages it looks at are
read): every field is taken as it is, except the ``raw_data`` of large top-level initializers,
which are left in the file and described by their offset and length.  :func:`onnxq.ir.load_model`
then makes them lazy tensors (:mod:`onnxq.ir.external`), exactly as if they were external data.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxq.errors import ModelLoadError

_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
_LENGTH_DELIMITED = 2
MIN_LEFT_BYTES = 4096  # smaller payloads are read in with the rest


@dataclass(frozen=True)
class LeftInFile:
    """The ``raw_data`` of initializer number ``index``: ``length`` bytes at ``offset``."""

    index: int
    offset: int
    length: int


def read_light(path: Path) -> tuple[onnx.ModelProto, list[LeftInFile]]:
    """The model in ``path`` with the ``raw_data`` of its large initializers left out, and
    where those bytes are in the file (raises ``ModelLoadError`` for a malformed file)."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        try:
            return _split(memoryview(mm), path)
        except (IndexError, ValueError) as exc:
            raise ModelLoadError(
                f"{path}: not a readable ONNX file ({exc}); check that the file is complete "
                "and really is an ONNX model"
            ) from None


def _split(buf: memoryview, path: Path) -> tuple[onnx.ModelProto, list[LeftInFile]]:
    rest = bytearray()
    graph_spans: list[tuple[int, int]] = []
    for field, wire, start, value, end in _fields(buf, 0, len(buf)):
        if field == _MODEL_GRAPH and wire == _LENGTH_DELIMITED:
            graph_spans.append((value, end))
        else:
            rest += buf[start:end]
    try:
        model = onnx.ModelProto.FromString(bytes(rest))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    left: list[LeftInFile] = []
    initializers: list[onnx.TensorProto] = []
    graph_rest = bytearray()
    for g_start, g_end in graph_spans:  # a repeated message field merges, in order
        for field, wire, start, value, end in _fields(buf, g_start, g_end):
            if field == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
                tensor, raw = _tensor(buf, value, end)
                if raw is not None:
                    left.append(LeftInFile(len(initializers), raw[0], raw[1]))
                initializers.append(tensor)
            else:
                graph_rest += buf[start:end]
    try:
        model.graph.MergeFromString(bytes(graph_rest))
    except Exception as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    model.graph.initializer.extend(initializers)
    return model, left


def _tensor(
    buf: memoryview, start: int, end: int
) -> tuple[onnx.TensorProto, tuple[int, int] | None]:
    """A TensorProto from ``buf[start:end]``; a large ``raw_data`` is left out and returned as
    (offset, length)."""
    kept = bytearray()
    raw: tuple[int, int] | None = None
    for field, wire, f_start, value, f_end in _fields(buf, start, end):
        if (
            field == _TENSOR_RAW_DATA
            and wire == _LENGTH_DELIMITED
            and f_end - value >= MIN_LEFT_BYTES
        ):
            raw = (value, f_end - value)
        else:
            kept += buf[f_start:f_end]
    try:
        tensor = onnx.TensorProto.FromString(bytes(kept))
    except Exception as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    return tensor, raw


def _fields(buf: memoryview, pos: int, end: int):  # type: ignore[no-untyped-def]
    """Yield ``(field number, wire type, field start, value start, field end)`` for each field
    of the message in ``buf[pos:end]``."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
            value = pos
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        elif wire == _LENGTH_DELIMITED:
            length, value = _varint(buf, pos)
            pos = value + length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {start}")
        if pos > end or field == 0:
            raise ValueError(f"truncated or malformed protobuf field at byte {start}")
        yield field, wire, start, value, pos


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError(f"malformed varint at byte {pos}")
