"""onnxq.pytorch.batches: torch calibration items as onnxq batches (numpy stands in for
tensors: an item without ``detach`` goes through ``np.asarray``)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.errors import CalibrationDataError
from onnxq.pytorch.batches import torch_batches


def test_tuples_feed_the_inputs_in_order_and_drop_labels_and_unused_inputs():
    items = [(np.ones(2), np.zeros(2), np.array([7]))]
    batches = torch_batches(items, ["x"], positional=["x", "unused"])
    assert len(batches) == 1
    (batch,) = list(batches)
    assert list(batch) == ["x"] and batch["x"].tolist() == [1.0, 1.0]
    assert list(batches) and list(batches)  # re-iterable, like the DataLoader it wraps


def test_a_path_passes_through_and_a_generator_stays_one_pass(tmp_path):
    assert torch_batches(str(tmp_path), ["x"]) == str(tmp_path)
    batches = torch_batches((np.ones(1) for _ in range(2)), ["x"])
    assert len(list(batches)) == 2 and list(batches) == []


def test_an_item_that_cannot_feed_the_inputs_says_what_to_pass():
    with pytest.raises(CalibrationDataError, match="pass calibration_fn="):
        list(torch_batches([(np.ones(1),)], ["a", "b"]))
    with pytest.raises(CalibrationDataError, match="yield tuples or dicts"):
        list(torch_batches([np.ones(1)], ["a", "b"]))
