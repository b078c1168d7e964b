"""Residual Adds before a LayerNormalization written as Sum: onnxruntime keeps the two ops apart
(no SkipLayerNormalization) and computes the same values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from onnxq import ir
from onnxq.place.rules.residual_sum import residual_sums
from tests import graphs

HIDDEN = 64


def rewritten(m: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    graph = ir.Graph(out)
    names = residual_sums(graph)
    graph.commit()
    return out, names


def optimized_ops(m: onnx.ModelProto, tmp_path) -> list[str]:
    """The op types of ``m`` after onnxruntime's default optimizations."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]


def feed(skip_rows: int = 2) -> dict[str, np.ndarray]:
    r = graphs.rng(1)
    return {
        "x": r.standard_normal((2, 5, HIDDEN)).astype(np.float32),
        "skip": r.standard_normal((skip_rows, 5, HIDDEN)).astype(np.float32),
    }


def run(m: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def test_the_residual_add_becomes_a_sum_that_onnxruntime_keeps_apart(tmp_path):
    m = graphs.encoder_block()
    assert "SkipLayerNormalization" in optimized_ops(m, tmp_path)  # what it does otherwise
    out, names = rewritten(m)
    assert names == ["residual"]
    assert graphs.op_types(out).count("Sum") == 1
    assert graphs.op_types(out).count("Add") == 1  # the bias Add: a constant input
    ops = optimized_ops(out, tmp_path)
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    np.testing.assert_allclose(run(out, feed())[0], run(m, feed())[0], rtol=1e-5, atol=1e-5)


def test_an_add_whose_sum_is_read_elsewhere_stays_an_add():
    # onnxruntime does not fuse it either (the sum has a second reader)
    out, names = rewritten(graphs.encoder_block(residual_readers=2))
    assert names == [] and "Sum" not in graphs.op_types(out)


def test_a_broadcasting_add_stays_an_add(tmp_path):
    # [b, s, H] + [1, s, H] (position embeddings): not the same shape, which the fusion needs
    m = graphs.encoder_block(skip_shape=(1, "s", HIDDEN))
    assert "SkipLayerNormalization" not in optimized_ops(m, tmp_path)
    out, names = rewritten(m)
    assert names == [] and "Sum" not in graphs.op_types(out)
    np.testing.assert_allclose(run(out, feed(1))[0], run(m, feed(1))[0], rtol=1e-6)


def test_an_add_before_another_op_stays_an_add():
    m = graphs.encoder_block()
    ln = next(n for n in m.graph.node if n.op_type == "LayerNormalization")
    ln.op_type, ln.input[:] = "Relu", ["sum"]
    del ln.attribute[:]
    out, names = rewritten(m)
    assert names == [] and "Sum" not in graphs.op_types(out)
