"""Copies of a model without its weights' bytes, for onnx's checker, shape inference and
version converter (which would otherwise serialise every weight, and fail past 2 GB)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

_STRIP_BYTES = 1024
# sub-byte and packed element types whose byte count is not n * itemsize
PACKED_TYPES = frozenset({TensorProto.STRING, 20, 21, 22, 23, 24, 25, 26})


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level graph has no initializers, made field by field so
    that the original's weights are neither copied nor touched."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    return light


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == 3  # REPEATED
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


@contextlib.contextmanager
def weights_stripped(model: onnx.ModelProto) -> Iterator[onnx.ModelProto]:
    """Yield a copy of ``model`` whose large initializers carry no data (only dims and type)."""
    light = copy_without_initializers(model)
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL and nbytes(tensor) <= _STRIP_BYTES:
            light.graph.initializer.append(tensor)
        else:
            light.graph.initializer.append(_empty_like(tensor))
    yield light


def restore_weights(converted: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    full = {t.name: t for t in original.graph.initializer}
    fixed = []
    for tensor in converted.graph.initializer:
        fixed.append(full.get(tensor.name, tensor))
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(fixed)
    return converted


def _empty_like(tensor: TensorProto) -> TensorProto:
    out = TensorProto()
    out.name = tensor.name
    out.data_type = tensor.data_type
    out.dims.extend(tensor.dims)
    n = int(np.prod(tensor.dims)) if tensor.dims else 1
    # shape inference and the checker only need a consistent header; an all-zero raw payload
    # of the right length would cost memory, so a zero-filled *small* tensor stands in when
    # the real one is big (values are never read by inference of our ops).
    if n * itemsize(tensor.data_type) <= _STRIP_BYTES:
        out.raw_data = bytes(n * itemsize(tensor.data_type))
    else:
        out.data_location = TensorProto.EXTERNAL
        out.external_data.add(key="location", value="onnxq-stripped.bin")
    return out


def itemsize(data_type: int) -> int:
    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize)
    except Exception:
        return 4


def nbytes(tensor: TensorProto) -> int:
    n = int(np.prod(tensor.dims)) if tensor.dims else 1
    return n * itemsize(tensor.data_type)


def weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for ``onnx.checker``: big weights become empty tensors of the same type."""
    with weights_stripped(model) as light:
        for tensor in light.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                del tensor.external_data[:]
                tensor.data_location = TensorProto.DEFAULT
                del tensor.dims[:]
                tensor.dims.append(0)
                tensor.raw_data = b""
        return light
