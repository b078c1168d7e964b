"""A block cut out of a Q/DQ model computes what onnxruntime computes for it; its gradient
matches finite differences (float block) and is the same in numpy and torch (Q/DQ block)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.recover.blockprogram import block_program
from onnxq.recover.blocks import find_blocks
from onnxq.recover.convengine import NumpyConv, TorchConv
from tests.recover.builders import inverted_residual
from tests.recover.test_adaround import smooth_batches
from tests.recover.test_seqround import exposed


@pytest.fixture(scope="module")
def quantized() -> tuple[onnx.ModelProto, onnx.ModelProto, list]:
    m = inverted_residual()
    batches = smooth_batches(m, n=4)
    # high_precision fp32: a block program is the Q/DQ graph's float32 arithmetic (recovery
    # runs before the FP16 typing; that is tested in tests/materialize/test_typing.py)
    return m, onnxq.quantize(m, batches, progress=False, high_precision="fp32").model, batches


def int8_convs(q: onnx.ModelProto) -> dict[str, str]:
    return {
        n.name: n.input[1]
        for n in q.graph.node
        if n.op_type == "Conv" and n.input[1].endswith("_dequantized")
    }


def test_every_block_computes_what_onnxruntime_computes(quantized):
    m, q, batches = quantized
    blocks = find_blocks(ir.Graph(m), int8_convs(q))
    assert len(blocks) == 3
    engine = NumpyConv()
    residual = block_program(q, blocks[1].input, blocks[1].output, {})
    assert not isinstance(residual, str)
    assert [s.kind for s in residual.steps] == [
        "quant", "conv", "clip", "quant", "conv", "clip", "quant", "conv", "add",
    ]  # fmt: skip
    for block in blocks:
        program = block_program(q, block.input, block.output, {})
        assert not isinstance(program, str), program
        for x, y in exposed(q, [block.input, block.output], batches):
            got, _ = program.forward(engine, engine.array(x), {})
            # a value on a rounding boundary may land one step apart: compare closely overall
            assert np.abs(got - y).mean() < 1e-5 * max(np.abs(y).max(), 1.0)
            assert np.abs(got - y).max() < 0.05 * np.abs(y).max()


def test_learned_weights_replace_the_written_ones(quantized):
    m, q, batches = quantized
    block = find_blocks(ir.Graph(m), int8_convs(q))[1]
    program = block_program(q, block.input, block.output, {"b2.depthwise": "b2.dw"})
    assert not isinstance(program, str)
    assert program.learned == {"b2.dw": "b2.depthwise"}
    (x,) = exposed(q, [block.input], batches[:1])[0]
    engine = NumpyConv()
    written = next(s.const for s in program.steps if s.weight == "b2.dw")
    same, _ = program.forward(engine, x, {"b2.dw": written})
    zero, _ = program.forward(engine, x, {"b2.dw": np.zeros_like(written)})
    plain, _ = block_program(q, block.input, block.output, {}).forward(engine, x, {})  # type: ignore[union-attr]
    np.testing.assert_array_equal(same, plain)
    assert np.abs(zero - plain).max() > 0


def test_the_gradient_matches_finite_differences():
    m = inverted_residual()
    graph = ir.Graph(m)
    names = {"b2.expand": "b2.ew", "b2.depthwise": "b2.dw", "b2.project": "b2.pw"}
    program = block_program(m, "b1.p", "b2.out", names)
    assert not isinstance(program, str)
    engine = NumpyConv()
    r = np.random.default_rng(1)
    x = r.standard_normal((2, 16, 8, 8)).astype(np.float32)
    weights = {w: graph.const_value(w).astype(np.float32) for w in names.values()}
    target = r.standard_normal((2, 16, 8, 8)).astype(np.float32)

    def loss(ws: dict) -> float:
        out, _ = program.forward(engine, x, ws)
        return float(np.square(out.astype(np.float64) - target).sum())

    out, values = program.forward(engine, x, weights)
    grads = program.backward(engine, 2.0 * (out - target), values, weights)
    for w in names.values():
        direction = r.standard_normal(weights[w].shape).astype(np.float32)
        eps = 1e-4  # small: a Clip's kink crossed by the step bends a larger difference
        up = loss({**weights, w: weights[w] + eps * direction})
        down = loss({**weights, w: weights[w] - eps * direction})
        numeric = (up - down) / (2 * eps)
        analytic = float((grads[w].astype(np.float64) * direction).sum())
        assert abs(numeric - analytic) <= 0.01 * abs(analytic) + 1.0, w
        assert abs(analytic) > 100.0, w


def test_numpy_and_torch_give_the_same_gradient(quantized):
    pytest.importorskip("torch")
    m, q, batches = quantized
    block = find_blocks(ir.Graph(m), int8_convs(q))[1]
    learned = {"b2.expand": "e", "b2.depthwise": "d", "b2.project": "p"}
    program = block_program(q, block.input, block.output, learned)
    assert not isinstance(program, str)
    (x,) = exposed(q, [block.input], batches[:1])[0]
    consts = {w: next(s.const for s in program.steps if s.weight == w) for w in "edp"}
    results = []
    for engine in (NumpyConv(), TorchConv()):
        ws = {w: engine.array(v) for w, v in consts.items()}
        out, values = program.forward(engine, engine.array(x), ws)
        grads = program.backward(engine, out * 2.0, values, ws)
        results.append((engine.numpy(out), {w: engine.numpy(g) for w, g in grads.items()}))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-4)
    for w in "edp":
        scale = np.abs(results[0][1][w]).max()
        np.testing.assert_allclose(results[0][1][w], results[1][1][w], atol=1e-4 * scale)


def test_an_op_no_block_holds_is_named():
    m = inverted_residual()
    why = block_program(m, "b2.out", "y", {})
    assert isinstance(why, str) and "Sigmoid" in why
