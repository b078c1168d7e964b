"""onnxq.pytorch.signature: forward's names and the outputs flattened and named."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.errors import UnsupportedModelError
from onnxq.pytorch.signature import flatten_outputs, forward_names


class _Module:
    def forward(self, image, mask=None):
        return image


def test_forward_names_follow_the_parameters_or_number_the_inputs():
    args = (np.ones(1), np.ones(1))
    assert forward_names(_Module(), args[:1]) == ["image"]
    assert forward_names(_Module(), args) == ["image", "mask"]
    assert forward_names(_Module(), (*args, np.ones(1))) == ["input_0", "input_1", "input_2"]


def test_outputs_are_named_by_key_and_position():
    class T:
        def detach(self):
            return self

    t = T()
    named = flatten_outputs({"boxes": t, "extra": (t, {"s": t})}, "output")
    assert [n for n, _ in named] == ["boxes", "extra_0", "extra_1.s"]
    with pytest.raises(UnsupportedModelError, match="'output' is a int, not a tensor"):
        flatten_outputs(3, "output")
