"""onnxq.pytorch.check: the exported model must give the module's outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxq.errors import UnsupportedModelError
from onnxq.pytorch.check import check_export


class _Tensor:
    """A stand-in for a torch tensor: what the check reads of one."""

    def __init__(self, value: np.ndarray):
        self.value = value

    def detach(self) -> _Tensor:
        return self

    def cpu(self) -> _Tensor:
        return self

    def numpy(self) -> np.ndarray:
        return self.value


def _relu_file(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    return path


def test_an_export_that_matches_passes_and_one_that_differs_says_by_how_much(tmp_path):
    path = _relu_file(tmp_path)
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    check_export(path, feeds, [("y", _Tensor(np.array([0.0, 2.0], np.float32)))], 1e-3, 1e-5)
    with pytest.raises(UnsupportedModelError, match="output 'y' max abs diff 1"):
        check_export(path, feeds, [("y", _Tensor(np.array([1.0, 2.0], np.float32)))], 1e-3, 1e-5)
