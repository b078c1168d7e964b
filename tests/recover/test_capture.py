"""Streaming capture of per-layer second moments: equal to the rows' own products, sampled
evenly, split into passes under a memory budget, paired with a quantized model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq import ir
from onnxq.data.inputs import model_inputs
from onnxq.errors import CalibrationDataError
from onnxq.recover.capture import capture_grams, row_sample
from onnxq.recover.layers import linear_layer
from tests.recover.builders import conv_chain, image_batches


def layers_of(m: onnx.ModelProto):
    g = ir.Graph(m)
    return [linear_layer(g, n) for n in g.nodes if n.op_type == "Conv"]


def exposed(m: onnx.ModelProto, names: list[str], batch):
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    del copy.graph.output[:]
    copy.graph.output.extend(onnx.helper.make_tensor_value_info(n, 1, None) for n in names)
    s = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, s.run(names, batch), strict=True))


def test_grams_are_the_products_of_all_rows():
    m = ir.infer_shapes(conv_chain())
    layers = layers_of(m)
    batches = image_batches(m, n=3)
    stats = capture_grams(
        m, layers, batches, model_inputs(ir.Graph(m)), rows_per_layer=10**6, progress=False
    )
    for layer in layers:
        want = np.zeros_like(stats[layer.node].qq)
        rows = 0
        for batch in batches:
            x = exposed(m, [layer.input], batch)[layer.input]
            r = layer.rows(x).astype(np.float64)
            want += r.transpose(0, 2, 1) @ r
            rows += r.shape[1]
        np.testing.assert_allclose(stats[layer.node].qq, want, rtol=1e-4, atol=1e-6)
        assert stats[layer.node].rows == rows
        assert stats[layer.node].qf is None


def test_row_sample_is_even_bounded_and_moves_with_the_batch():
    assert row_sample(100, 200, 0) is None
    a, b = row_sample(1000, 64, 0), row_sample(1000, 64, 1)
    assert len(a) == 64 and len(b) == 64
    assert np.all(np.diff(a) == 1000 // 64) and a.max() < 1000
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, row_sample(1000, 64, 0))


def test_a_small_memory_budget_takes_several_passes_with_the_same_result():
    m = ir.infer_shapes(conv_chain())
    layers = layers_of(m)
    batches = image_batches(m, n=3)
    inputs = model_inputs(ir.Graph(m))
    one = capture_grams(m, layers, batches, inputs, rows_per_layer=300, progress=False)
    many = capture_grams(
        m, layers, batches, inputs, rows_per_layer=300, memory_budget=1, progress=False
    )
    for name in one:
        np.testing.assert_array_equal(one[name].qq, many[name].qq)
    with pytest.raises(CalibrationDataError, match="read only once"):
        capture_grams(m, layers, iter(batches), inputs, memory_budget=1, progress=False)


def test_paired_with_the_same_model_all_three_sums_agree():
    m = ir.infer_shapes(conv_chain())
    layers = layers_of(m)
    stats = capture_grams(
        m,
        layers,
        image_batches(m, n=2),
        model_inputs(ir.Graph(m)),
        quant_model=m,
        quant_inputs={layer.node: layer.input for layer in layers},
        progress=False,
    )
    for s in stats.values():
        assert s.qf is not None and s.ff is not None
        np.testing.assert_allclose(s.qf, s.qq, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(s.ff, s.qq, rtol=1e-4, atol=1e-6)
