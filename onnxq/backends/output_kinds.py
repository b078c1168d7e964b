"""What kind of output a model gives, for the fidelity figures a user reads beside the cosine:
class scores (top-1 agreement) and sigmoid probabilities (agreement at a threshold).

Class scores are recognised by what they hold, not by the op that made them: a float output
whose rows along an axis are probabilities (non-negative, summing to 1) or log-probabilities
(their exponentials sum to 1), such as a softmax a converter decomposed into Exp/ReduceSum/Div;
or, by shape, the ``[batch, classes]`` logits of a classifier head (a Gemm/MatMul, at least
:data:`MIN_CLASSES` columns).  Sigmoid outputs are the outputs of a Sigmoid/HardSigmoid, also
behind layout ops (Reshape, Transpose, ...); each value is a probability read against a
threshold (``agreement_threshold``, 0.5 by default), so the share of values on the same side
of it is what a user of the output sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxq import ir

MIN_CLASSES = 10  # a [batch, C] Gemm/MatMul output from this many columns on is class logits
SUM_TOLERANCE = 1e-3  # rows of probabilities sum to 1 within this
LAYOUT_OPS = frozenset(
    {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Slice"}
)
SIGMOID_OPS = frozenset({"Sigmoid", "HardSigmoid"})
LINEAR_HEADS = frozenset({"Gemm", "MatMul", "Conv"})


@dataclass(frozen=True)
class OutputKinds:
    """A model's sigmoid outputs and its candidate logits, and the sigmoid threshold."""

    sigmoids: frozenset[str] = field(default_factory=frozenset)
    logits: frozenset[str] = field(default_factory=frozenset)
    threshold: float = 0.5


def output_kinds(model: onnx.ModelProto, threshold: float = 0.5) -> OutputKinds:
    """The kinds of ``model``'s outputs that its graph shows."""
    return OutputKinds(
        frozenset(sigmoid_outputs(model)), frozenset(logit_outputs(model)), threshold
    )


def _source(graph: ir.Graph, name: str) -> onnx.NodeProto | None:
    """The op that computes ``name``, looking through layout ops."""
    node = graph.producer.get(name)
    while node is not None and node.op_type in LAYOUT_OPS and node.input:
        node = graph.producer.get(node.input[0])
    return node


def sigmoid_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs that a Sigmoid or HardSigmoid computes (behind layout ops)."""
    graph = ir.Graph(model)
    return {
        name
        for name in graph.graph_outputs
        if (node := _source(graph, name)) is not None and node.op_type in SIGMOID_OPS
    }


def logit_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs of rank 2 that a Gemm/MatMul/Conv computes (behind layout ops): a
    classifier head's ``[batch, classes]`` logits when wide enough (:func:`score_axis`)."""
    graph = ir.Graph(model)
    return {
        name
        for name in graph.graph_outputs
        if len(graph.shape(name) or ()) == 2
        and (node := _source(graph, name)) is not None
        and node.op_type in LINEAR_HEADS
    }


def score_axis(ref: list[np.ndarray], logits: bool = False) -> int | None:
    """The class axis of an output from its float values: the last axis (then the others
    after the first) along which every row holds probabilities or log-probabilities; for
    ``logits`` (:func:`logit_outputs`) the last axis of a ``[batch, C]`` output with at
    least :data:`MIN_CLASSES` columns.  None: not class scores."""
    if not ref or any(r.ndim < 2 or r.size == 0 or r.dtype.kind != "f" for r in ref):
        return None
    if any(r.shape[1:] != ref[0].shape[1:] for r in ref):
        return None
    rank = ref[0].ndim
    for axis in [rank - 1, *range(1, rank - 1)]:
        if ref[0].shape[axis] >= 2 and all(_probabilities(r, axis) for r in ref):
            return axis - rank
    if logits and rank == 2 and ref[0].shape[1] >= MIN_CLASSES:
        return -1
    return None


def _probabilities(r: np.ndarray, axis: int) -> bool:
    r = r.astype(np.float64)
    if not np.isfinite(r).all():
        return False
    if r.min() >= 0 and r.max() <= 1 + SUM_TOLERANCE:
        sums = r.sum(axis=axis)
    elif r.max() <= SUM_TOLERANCE:  # log-probabilities
        sums = np.exp(r).sum(axis=axis)
    else:
        return False
    return bool(np.abs(sums - 1).max() <= SUM_TOLERANCE)


def threshold_agreement(
    ref: list[np.ndarray], got: list[np.ndarray], threshold: float
) -> float | None:
    """The share of values on the same side of ``threshold`` in both models (None: shapes
    that differ)."""
    same = total = 0
    for r, g in zip(ref, got, strict=True):
        if r.shape != g.shape:
            return None
        same += int(np.count_nonzero((r > threshold) == (g > threshold)))
        total += r.size
    return round(same / total, 6) if total else None
