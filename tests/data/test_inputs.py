"""What a model's inputs hold, from their types and shapes."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq import ir
from onnxq.data.inputs import InputSpec, input_kind, model_inputs
from tests import graphs


@pytest.mark.parametrize(
    ("dtype", "shape", "kind"),
    [
        ("float32", ("N", 3, 224, 224), "image"),
        ("float32", (1, 224, 224, 3), "image"),  # NHWC too
        ("int64", ("batch", "seq"), "tokens"),
        ("int32", (1, 128), "tokens"),
        ("float32", ("", ""), "audio"),  # a waveform of any length (silero_vad)
        ("float32", (1, 16000), "audio"),
        ("float32", (1, 80, "frames"), "audio"),  # a spectrogram
        ("float32", (1, 64), "other"),  # features
        ("float32", (2, "", 128), "other"),  # a recurrent state
        ("int64", (), "other"),  # a sample rate
        ("float32", None, "other"),
    ],
)
def test_input_kinds(dtype, shape, kind):
    assert input_kind(InputSpec("x", np.dtype(dtype), shape)) == kind


def test_model_inputs_leave_initializers_out():
    specs = model_inputs(ir.Graph(graphs.conv_relu()))
    assert specs == [InputSpec("x", np.dtype("float32"), (1, 16, 8, 8))]
