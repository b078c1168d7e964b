"""What a model takes: its inputs' names, types and shapes, what kind of data each holds, and
the batch type that calibration feeds it.

Messages that advise on calibration data read :func:`input_kind` (an image, an audio signal,
token ids) instead of assuming images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from onnx import helper

Batch = dict[str, np.ndarray]

InputKind = Literal["image", "audio", "tokens", "other"]

# a float input of rank 2 or 3 whose last axis is longer than this (or dynamic) holds a signal
# along time: audio samples (a waveform) or frames (a spectrogram)
_SIGNAL_LENGTH = 1000


@dataclass(frozen=True)
class InputSpec:
    """What the model expects of one input."""

    name: str
    dtype: np.dtype  # type: ignore[type-arg]
    shape: tuple[int | str | None, ...] | None


def model_inputs(graph: Any) -> list[InputSpec]:
    """The model's (non-initializer) inputs, from an ``onnxq.ir.Graph``."""
    specs = []
    for name in graph.graph_inputs:
        elem = graph.elem_type(name)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype("float32")
        specs.append(InputSpec(name, dtype, graph.shape(name)))
    return specs


def input_kind(spec: InputSpec) -> InputKind:
    """What an input most likely holds, from its type and shape.

    ``image``: a float tensor of rank 4 (NCHW or NHWC).  ``tokens``: integer ids of rank 2
    (batch, sequence; an attention mask counts too).  ``audio``: a float tensor of rank 2 or 3
    whose last axis is dynamic or longer than 1000 (samples of a waveform, frames of a
    spectrogram).  ``other``: anything else (features, a recurrent state, a scalar).
    """
    shape = spec.shape
    if shape is None:
        return "other"
    if spec.dtype.kind == "f" and len(shape) == 4:
        return "image"
    if spec.dtype.kind in "iu" and len(shape) == 2:
        return "tokens"
    if spec.dtype.kind == "f" and len(shape) in (2, 3):
        last = shape[-1]
        if not isinstance(last, int) or last <= 0 or last > _SIGNAL_LENGTH:
            return "audio"
    return "other"
