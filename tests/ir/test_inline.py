"""Large model files: inline weights stay in the file until read."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxq import ir
from onnxq.errors import ModelLoadError
from onnxq.ir import external, inline
from tests import graphs
from tests.weightonly import models


def test_read_light_leaves_large_payloads_in_the_file_and_keeps_everything_else(tmp_path):
    m = models.decoder(vocab=512, hidden=64, ffn=128)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    light, left = inline.read_light(path)
    assert {light.graph.initializer[x.index].name for x in left} >= {"embed", "w_up", "lm_head"}
    data = path.read_bytes()
    for x in left:
        tensor = light.graph.initializer[x.index]
        assert not tensor.raw_data
        want = next(t for t in m.graph.initializer if t.name == tensor.name)
        assert data[x.offset : x.offset + x.length] == want.raw_data
    small = [t for t in light.graph.initializer if t.name == "eps"]
    assert small and small[0].raw_data  # small payloads are read in
    assert [n.name for n in light.graph.node] == [n.name for n in m.graph.node]
    assert light.graph.input == m.graph.input and light.opset_import == m.opset_import


def test_load_model_of_a_large_file_is_lazy_and_equal(tmp_path, monkeypatch):
    monkeypatch.setattr(external, "LAZY_BYTES", 1024)
    m = models.decoder()
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    loaded = ir.load_model(path, 21)
    assert external.has_lazy(loaded)
    for tensor in m.graph.initializer:
        got = next(t for t in loaded.graph.initializer if t.name == tensor.name)
        np.testing.assert_array_equal(
            external.tensor_array(got), onnx.numpy_helper.to_array(tensor)
        )


def test_a_truncated_large_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(external, "LAZY_BYTES", 1024)
    path = tmp_path / "m.onnx"
    onnx.save(models.decoder(), str(path))
    path.write_bytes(path.read_bytes()[:-5000])
    with pytest.raises(ModelLoadError, match=r"m\.onnx"):
        ir.load_model(path, 21)


def test_a_small_file_is_read_as_before(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(graphs.conv_relu(), str(path))
    assert not external.has_lazy(ir.load_model(path))
