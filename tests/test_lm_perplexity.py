"""scripts/lm_perplexity.py: the perplexity of a tiny causal LM against numpy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests import graphs
from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
VOCAB, WIDTH = 11, 4


def tiny_lm(embed: np.ndarray, head: np.ndarray) -> onnx.ModelProto:
    """logits = head(embed[input_ids]): each token predicts the next from itself alone."""
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "head"], ["logits"], name="head"),
    ]
    inputs = [graphs.tensor("input_ids", [1, "t"], TensorProto.INT64)]
    outputs = [graphs.tensor("logits", [1, "t", VOCAB])]
    inits = [graphs.init("embed", embed), graphs.init("head", head)]
    return graphs.model(nodes, inputs, outputs, inits, name="tiny_lm")


def test_perplexity_is_exp_of_the_mean_next_token_nll(tmp_path):
    r = graphs.rng(0)
    embed, head = graphs.weight(r, VOCAB, WIDTH, scale=1.0), graphs.weight(r, WIDTH, VOCAB)
    path = tmp_path / "lm.onnx"
    onnx.save(tiny_lm(embed, head), path)
    ids = r.integers(0, VOCAB, size=(3, 9))
    nll = []
    for window in ids:
        logits = (embed[window] @ head).astype(np.float64)[:-1]
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll.extend(-logp[np.arange(len(window) - 1), window[1:]])
    expected = math.exp(float(np.mean(nll)))
    assert abs(load_script("lm_perplexity").perplexity(path, ids) - expected) < 1e-4 * expected
