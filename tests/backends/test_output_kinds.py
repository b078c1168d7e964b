"""Class scores by values or shape, sigmoid outputs at a threshold, worst-sample warnings."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnxq
from onnxq.backends.output_kinds import (
    OutputKinds,
    logit_outputs,
    score_axis,
    sigmoid_outputs,
    threshold_agreement,
)
from onnxq.backends.validate import OutputFidelity, fidelity
from onnxq.report.fidelity import verification_messages
from onnxq.validate.verify import Verification
from tests import graphs


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_probabilities_and_log_probabilities_are_class_scores_along_their_axis():
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    assert score_axis([_softmax(x, -1)]) == -1
    assert score_axis([np.log(_softmax(x, -1))]) == -1
    assert score_axis([_softmax(x, 1)]) == -2  # a [N, C, H]-style class axis
    assert score_axis([x]) is None  # no probabilities: not without the logits shape
    assert score_axis([x[:, :, 0]], logits=True) is None  # 5 columns: too few for classes
    assert score_axis([np.zeros((3, 12), np.float32)], logits=True) == -1


def _decomposed_softmax_model():
    """x -> Gemm -> Exp -> ReduceSum -> Div: a softmax without a Softmax node (jax2tf)."""
    r = graphs.rng()
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["logits"], name="fc", transB=1),
        helper.make_node("Exp", ["logits"], ["e"], name="exp"),
        helper.make_node("ReduceSum", ["e", "axes"], ["s"], name="sum", keepdims=1),
        helper.make_node("Div", ["e", "s"], ["probs"], name="div"),
    ]
    inits = [
        graphs.init("w", graphs.weight(r, 16, 32, scale=0.3)),
        graphs.init("b", graphs.weight(r, 16)),
        graphs.init("axes", np.array([1], np.int64)),
    ]
    return graphs.model(
        nodes, [graphs.tensor("x", [4, 32])], [graphs.tensor("probs", [4, 16])], inits
    )


def test_a_decomposed_softmax_gets_a_top1_agreement():
    model = _decomposed_softmax_model()
    report = onnxq.quantize(model, graphs.random_batches(model, 4), progress=False).report
    (probs,) = report.fidelity
    assert probs.top1_agreement is not None and 0.5 < probs.top1_agreement <= 1.0


def test_a_classifier_head_logits_output_is_recognised_by_shape():
    model = _decomposed_softmax_model()
    del model.graph.node[1:]
    model.graph.output[0].name = "logits"
    assert logit_outputs(model) == {"logits"}
    assert logit_outputs(graphs.gemm()) == set()  # behind a Relu: not a classifier head
    report = onnxq.quantize(model, graphs.random_batches(model, 4), progress=False).report
    assert report.fidelity[0].top1_agreement is not None


def test_sigmoid_outputs_are_compared_at_the_threshold():
    model = graphs.unary("Sigmoid", tail=False)
    assert sigmoid_outputs(model) == {"y"}
    ref = [np.array([[0.1, 0.49, 0.51, 0.9]], np.float32)]
    got = [np.array([[0.1, 0.51, 0.49, 0.9]], np.float32)]  # cosine ~1, two values flip
    assert threshold_agreement(ref, got, 0.5) == 0.5
    assert threshold_agreement(ref, got, 0.3) == 1.0
    (out,) = fidelity(
        [{"y": ref[0]}], [{"y": got[0]}], kinds=OutputKinds(frozenset({"y"}), threshold=0.5)
    )
    assert out.cosine > 0.999 and out.threshold == 0.5 and out.threshold_agreement == 0.5
    (warning,) = verification_messages(Verification("m", [out]))[0]
    assert "50.0% of its values fall on the other side of 0.5" in warning


def test_config_threshold_reaches_the_report():
    model = graphs.unary("Sigmoid", tail=False)
    batches = graphs.random_batches(model, 4)
    report = onnxq.quantize(model, batches, progress=False, agreement_threshold=0.3).report
    (y,) = report.fidelity
    assert y.threshold == 0.3 and y.threshold_agreement is not None


def test_the_worst_sample_warns_though_the_mean_passes():
    out = OutputFidelity(
        "y", 0.964, 0.5, 3.0, sample_cosine_mean=0.953, worst_sample_cosine=0.807,
        worst_samples=(12, 3, 40),
    )  # fmt: skip
    warnings, _ = verification_messages(Verification("m", [out]))
    (warning,) = warnings
    assert "worst sample only at 0.807" in warning and "held samples 12, 3, 40" in warning


def test_fidelity_names_the_worst_samples():
    ref = [np.ones((2, 8), np.float32), np.ones((2, 8), np.float32)]
    got = [np.ones((2, 8), np.float32), np.ones((2, 8), np.float32)]
    got[1][1, :4] = -1  # sample 3 (batch 1, item 1) flips half its values
    got[0][0, 0] = 0.5  # sample 0 a little
    (out,) = fidelity([{"y": r} for r in ref], [{"y": g} for g in got])
    assert out.worst_samples[:2] == (3, 0)
    assert out.worst_sample_cosine == pytest.approx(0.0)
