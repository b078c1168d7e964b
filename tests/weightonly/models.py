"""Tiny language-model-like graphs for the weight-only tests (float32, opset 21).

``decoder``: an embedding lookup, one block (a normalisation scaled by a constant, two
projections that read the same input, a gated product, a down projection, a residual add), a
final normalisation and an LM head that the output reads directly.  Weights come from a seeded
RNG; a few input channels of the projections carry much larger values than the rest (as
language models' activations do), which is what AWQ and GPTQ exploit.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests import graphs

OPSET = 21


def _norm(x: str, gain: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """``x / sqrt(mean(x^2) + eps) * gain`` (RMSNorm as exporters write it)."""
    return [
        helper.make_node("Mul", [x, x], [f"{prefix}_sq"], name=f"{prefix}_sq"),
        helper.make_node(
            "ReduceMean",
            [f"{prefix}_sq", "axes_last"],
            [f"{prefix}_ms"],
            name=f"{prefix}_mean",
            keepdims=1,
        ),
        helper.make_node("Add", [f"{prefix}_ms", "eps"], [f"{prefix}_mse"], name=f"{prefix}_eps"),
        helper.make_node("Sqrt", [f"{prefix}_mse"], [f"{prefix}_rms"], name=f"{prefix}_sqrt"),
        helper.make_node("Div", [x, f"{prefix}_rms"], [f"{prefix}_n"], name=f"{prefix}_div"),
        helper.make_node("Mul", [f"{prefix}_n", gain], [out], name=f"{prefix}_gain"),
    ]


def decoder(vocab: int = 96, hidden: int = 64, ffn: int = 128, seed: int = 0) -> onnx.ModelProto:
    """input_ids int64 [batch, seq] -> logits [batch, seq, vocab]."""
    r = graphs.rng(seed)
    gain = (1.0 + 4.0 * (r.random(hidden) < 0.1)).astype(np.float32)  # a few loud channels
    inits = [
        graphs.init("embed", graphs.weight(r, vocab, hidden, scale=1.0)),
        graphs.init("g1", gain),
        graphs.init("g2", np.ones(hidden, np.float32)),
        graphs.init("w_gate", graphs.weight(r, hidden, ffn)),
        graphs.init("w_up", graphs.weight(r, hidden, ffn)),
        graphs.init("w_down", graphs.weight(r, ffn, hidden)),
        graphs.init("lm_head", graphs.weight(r, hidden, vocab)),
        graphs.init("axes_last", np.array([-1], np.int64)),
        graphs.init("eps", np.array(1e-6, np.float32)),
    ]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"], name="embedding")]
    nodes += _norm("h0", "g1", "x1", "norm1")
    nodes += [
        helper.make_node("MatMul", ["x1", "w_gate"], ["gate"], name="gate_proj"),
        helper.make_node("MatMul", ["x1", "w_up"], ["up"], name="up_proj"),
        helper.make_node("Sigmoid", ["gate"], ["gate_sig"], name="silu_sigmoid"),
        helper.make_node("Mul", ["gate", "gate_sig"], ["gate_act"], name="silu"),
        helper.make_node("Mul", ["gate_act", "up"], ["ffn_in"], name="gated"),
        helper.make_node("MatMul", ["ffn_in", "w_down"], ["ffn_out"], name="down_proj"),
        helper.make_node("Add", ["h0", "ffn_out"], ["h1"], name="residual"),
    ]
    nodes += _norm("h1", "g2", "x2", "norm2")
    nodes.append(helper.make_node("MatMul", ["x2", "lm_head"], ["logits"], name="lm_head_proj"))
    return graphs.model(
        nodes,
        [graphs.tensor("input_ids", ["batch", "seq"], TensorProto.INT64)],
        [graphs.tensor("logits", ["batch", "seq", vocab])],
        inits,
        opset=OPSET,
        name="decoder",
    )


def token_batches(
    n: int = 4, seq: int = 32, vocab: int = 96, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """``n`` batches of random token ids [1, seq]."""
    r = graphs.rng(seed)
    return [{"input_ids": r.integers(0, vocab, size=(1, seq)).astype(np.int64)} for _ in range(n)]


def linear(k: int = 64, n: int = 48, seed: int = 0) -> onnx.ModelProto:
    """One MatMul ``y = x @ w`` with a float input [rows, k]."""
    r = graphs.rng(seed)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")
    return graphs.model(
        [node],
        [graphs.tensor("x", ["rows", k])],
        [graphs.tensor("y", ["rows", n])],
        [graphs.init("w", graphs.weight(r, k, n))],
        opset=OPSET,
        name="linear",
    )


def loud_inputs(
    k: int = 64, rows: int = 64, n: int = 4, seed: int = 1
) -> list[dict[str, np.ndarray]]:
    """Batches whose channels are correlated and a few of them ~20x louder than the rest."""
    r = graphs.rng(seed)
    mix = (np.eye(k) + 0.3 * r.standard_normal((k, k))).astype(np.float32)
    loud = np.ones(k, np.float32)
    loud[r.choice(k, size=max(1, k // 16), replace=False)] = 20.0
    return [{"x": (r.standard_normal((rows, k)).astype(np.float32) @ mix) * loud} for _ in range(n)]
