"""Temporary outputs: a model that shows other tensors as its outputs for the length of a block.

Calibration and analysis run the same model with other outputs.  Copying a model would copy
every weight (2 GB models), so the outputs are swapped in place and restored when the block
ends, even on error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import onnx
from onnx import helper


@contextlib.contextmanager
def with_outputs(
    model: onnx.ModelProto, outputs: Sequence[onnx.ValueInfoProto]
) -> Iterator[onnx.ModelProto]:
    """``model`` with exactly ``outputs`` as its outputs, for the duration of the block."""
    graph = model.graph
    saved = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in graph.output]
    del graph.output[:]
    try:
        graph.output.extend(outputs)
        yield model
    finally:
        del graph.output[:]
        graph.output.extend(saved)


PEAKS_OUTPUT = "onnxq_probe/channel_max"


@contextlib.contextmanager
def with_channel_peaks(
    model: onnx.ModelProto, outputs: Sequence[onnx.ValueInfoProto], tensors: Sequence[str]
) -> Iterator[onnx.ModelProto]:
    """``model`` whose outputs are ``outputs`` and then :data:`PEAKS_OUTPUT`: the per-channel
    maxima of the rank-4 ``tensors`` (a GlobalMaxPool each), joined along axis 1, shape
    (N, sum of their channels, 1, 1); for the duration of the block.  The added nodes are
    removed afterwards, even on error.

    The pools run in onnxruntime's blocked NCHWc layout, where exposing a whole tensor would
    first convert it back to NCHW; one joined output instead of dozens of tiny ones saves a
    layout conversion each."""
    graph = model.graph
    nodes, shown = [], []
    if tensors:
        pooled = [f"{PEAKS_OUTPUT}/{i}" for i in range(len(tensors))]
        nodes = [
            helper.make_node("GlobalMaxPool", [t], [p], name=p)
            for t, p in zip(tensors, pooled, strict=True)
        ]
        nodes.append(helper.make_node("Concat", pooled, [PEAKS_OUTPUT], name=PEAKS_OUTPUT, axis=1))
        shown = [helper.make_tensor_value_info(PEAKS_OUTPUT, onnx.TensorProto.FLOAT, None)]
    count = len(graph.node)
    graph.node.extend(nodes)
    try:
        with with_outputs(model, list(outputs) + shown) as aug:
            yield aug
    finally:
        del graph.node[count:]
