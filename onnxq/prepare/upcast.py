"""A model exported in FP16 or BF16, computed in FP32 while onnxq works on it.

Placement, calibration and recovery work on FP32 tensors.  :func:`upcast` turns an FP16/BF16
model (or one that mixes them with FP32 through Casts) into its FP32 form: initializers and
Constant values widened exactly, Casts to FP16/BF16 cast to FP32, ConstantOfShape fills and
the declared types of inputs, outputs and value infos FP32, in control-flow bodies too.  It
returns the graph inputs' and outputs' original types: the precision plan
(:mod:`onnxq.place.precision`) writes the float compute back in the run's high precision,
and :func:`onnxq.materialize.typing.write_precisions` gives the inputs and outputs their
types back, so the quantized model takes and gives what the original did.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from onnxq import ir

HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
HALF_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}
FLOAT = onnx.TensorProto.FLOAT


def half_types(model: onnx.ModelProto) -> set[int]:
    """The half types (FP16, BF16) ``model``'s tensors or Casts use."""
    found: set[int] = set()
    for graph in _graphs(model.graph):
        found |= {t.data_type for t in graph.initializer if t.data_type in HALF}
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.tensor_type.elem_type in HALF:
                found.add(vi.type.tensor_type.elem_type)
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.i in HALF:
                    found.add(int(attr.i))
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in HALF:
                    found.add(int(attr.t.data_type))
    return found


def upcast(model: onnx.ModelProto) -> dict[str, int]:
    """Turn ``model`` (in place) into its FP32 form; returns the original element type of each
    FP16/BF16 graph input and output (empty: the model had none)."""
    if not half_types(model):
        return {}
    io = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in [*model.graph.input, *model.graph.output]
        if vi.type.tensor_type.elem_type in HALF
    }
    for graph in _graphs(model.graph):
        for i, tensor in enumerate(graph.initializer):
            if tensor.data_type in HALF:
                graph.initializer[i].CopyFrom(_widened(tensor))
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            if vi.type.tensor_type.elem_type in HALF:
                vi.type.tensor_type.elem_type = FLOAT
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.i in HALF:
                    attr.i = FLOAT
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in HALF:
                    attr.t.CopyFrom(_widened(attr.t))
    return io


def _widened(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """An FP16/BF16 tensor as FP32, the same values (exact: FP32 holds every one)."""
    raw = ir.external.tensor_array(tensor) if ir.external.is_lazy(tensor) else None
    value = (raw if raw is not None else numpy_helper.to_array(tensor)).astype(np.float32)
    return numpy_helper.from_array(value, tensor.name)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every control-flow body inside it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for body in ir.attr_graphs(attr):
                yield from _graphs(body)


__all__ = ["HALF", "HALF_NAMES", "half_types", "upcast"]
