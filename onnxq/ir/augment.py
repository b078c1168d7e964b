"""Temporary outputs: a model that shows other tensors as its outputs for the length of a block.

Calibration and analysis run the same model with other outputs.  Copying a model would copy
every weight (2 GB models), so the outputs are swapped in place and restored when the block
ends, even on error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import onnx


@contextlib.contextmanager
def with_outputs(model: onnx.ModelProto,
                 outputs: Sequence[onnx.ValueInfoProto]) -> Iterator[onnx.ModelProto]:
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
