"""Depthwise activation equalization: give every channel of the activation between a Conv
and the depthwise Conv that reads it the same range, at no cost to either weight.

For ``Conv1 -> f -> DWConv`` (``DWConv``: one input channel per group, one output per
group, as in every MobileNet inverted-residual block) scaling Conv1's output channel ``c``
(its weights and bias) by ``s_c > 0`` and dividing DWConv's channel ``c`` by ``s_c`` keeps
the model's function when ``f`` is positively homogeneous (nothing, Relu, LeakyRelu,
PRelu).  Both weights are quantized per output channel, so their integer weights do not
change (their per-channel scales absorb ``s``); only the activation does: one per-tensor scale
then serves channels whose ranges were 10-100x apart, the way a per-channel activation
scale would.  ``s_c = T / m_c`` with ``m_c`` the channel's largest value on the calibration
data and ``T`` the largest over channels, bounded to ``[1, max_scale]``: channels are only
scaled up, and at most by ``max_scale`` (a channel's peak on 64 images underestimates what
it reaches on others: scaled further, it would be clipped where its float value is not).

``f = Clip(0, hi)`` (ReLU6): ``Clip(s x, 0, hi)`` equals ``s Clip(x, 0, hi)`` wherever
``s x <= hi``, which holds on all the calibration data (``s_c m_c <= T <= hi``); beyond, the
Q/DQ on the Clip's output (its range ``R <= hi``) clamps both at ``R``, so the quantized
model is the same as an exact per-channel ``Min(Relu(x), s hi)`` would give, without the
extra op.  That holds only while the Clip's output is quantized: kept float (an exclusion,
a ``--target`` search), a channel that passes ``hi / s_c`` on new data is clipped there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import Batch, InputSpec
from onnxq.recover.capture import channel_peaks
from onnxq.recover.cle import ConvPair, conv_pairs

DEFAULT_MAX_SCALE = 4.0  # mobilenet_v2: docs/recovery.md
HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu"})  # f(s x) = s f(x) for s > 0


@dataclass(frozen=True)
class EqualizedPair:
    """One Conv -> [activation] -> depthwise Conv pair whose activation was equalized."""

    first: str
    second: str
    tensor: str  # the activation the depthwise Conv reads
    activation: str  # op type between them ("" for none)
    channels: int
    spread_before: float  # largest over smallest nonzero channel peak
    spread_after: float
    largest_scale: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def equalize_depthwise(
    model: onnx.ModelProto,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_scale: float = DEFAULT_MAX_SCALE,
    max_batches: int | None = None,
    progress: bool = True,
) -> tuple[onnx.ModelProto, list[EqualizedPair]]:
    """Equalize the activation of every eligible pair of ``model`` (edited in place; returned
    with shapes inferred again) from its channel peaks on ``data``; one entry per pair that
    changed."""
    graph = ir.Graph(model)
    pairs = [p for p in _pairs(graph) if not _problem(graph, p)]
    if not pairs:
        return model, []
    peaks = channel_peaks(
        model, [p.tensor for p in pairs], data, inputs, axis=1, label="depthwise equalization",
        max_batches=max_batches, progress=progress,
    )  # fmt: skip
    done = []
    for pair in pairs:
        peak = peaks[pair.tensor]
        scale = channel_scales(peak, max_scale)
        if np.all(scale == 1.0):
            continue
        _scale_pair(graph, pair, scale)
        done.append(
            EqualizedPair(
                pair.first.name,
                pair.second.name,
                pair.tensor,
                pair.activation.op_type if pair.activation is not None else "",
                int(peak.size),
                _spread(peak),
                _spread(peak * scale),
                float(scale.max()),
            )
        )
    if not done:
        return model, []
    graph.commit()
    return ir.infer_shapes(graph.model), done


def channel_scales(peak: np.ndarray, max_scale: float) -> np.ndarray:
    """``clip(T / peak, 1, max_scale)`` per channel (``T``: the largest peak); 1 for a
    channel that never left zero."""
    top = float(peak.max(initial=0.0))
    scale = np.ones_like(peak, dtype=np.float64)
    alive = peak > 0
    scale[alive] = np.clip(top / peak[alive], 1.0, max_scale)
    return scale


# ------------------------------------------------------------------------------- matching
def _pairs(graph: ir.Graph) -> list[ConvPair]:
    """Conv -> [one single-reader activation] -> Conv chains whose second Conv is ONNX's."""
    return [p for p in conv_pairs(graph) if p.second.domain in ir.DEFAULT_DOMAINS]


def _problem(graph: ir.Graph, pair: ConvPair) -> str:
    """Why the pair cannot be equalized ("" when it can)."""
    act = pair.activation
    if act is not None and act.domain not in ir.DEFAULT_DOMAINS:
        return "custom-domain activation"
    if act is not None and act.op_type == "Clip":
        lo, hi = graph.clip_bounds(act)
        if lo != 0.0 or hi is None or hi <= 0.0:
            return "a Clip whose lower bound is not 0"
    elif act is not None and act.op_type not in HOMOGENEOUS:
        return f"{act.op_type} does not commute with a per-channel scale"
    for node in (pair.first, pair.second):
        w = graph.const_value(node.input[1])
        if w is None or w.dtype != np.float32 or w.ndim < 3:
            return f"{node.name}'s weight is not a float32 constant"
        if len(graph.consumers.get(node.input[1], [])) != 1:
            return f"{node.name}'s weight is shared"
    if len(pair.first.input) > 2 and pair.first.input[2]:
        bias = graph.const_value(pair.first.input[2])
        if bias is None or len(graph.consumers.get(pair.first.input[2], [])) != 1:
            return f"{pair.first.name}'s bias is not a constant of its own"
    w1 = graph.const_value(pair.first.input[1])
    w2 = graph.const_value(pair.second.input[1])
    assert w1 is not None and w2 is not None
    groups = int(ir.node_attrs(pair.second).get("group", 1))
    if not (w2.shape[1] == 1 and groups == w2.shape[0] == w1.shape[0]):
        return f"{pair.second.name} is not depthwise over {pair.first.name}'s channels"
    return ""


# ------------------------------------------------------------------------------- scaling
def _scale_pair(graph: ir.Graph, pair: ConvPair, scale: np.ndarray) -> None:
    """Multiply the first Conv's output channels (weights, bias) by ``scale`` and divide the
    depthwise Conv's channels by it."""
    for name, factor in ((pair.first.input[1], scale), (pair.second.input[1], 1.0 / scale)):
        w = graph.const_value(name)
        assert w is not None
        shaped = factor.reshape(-1, *([1] * (w.ndim - 1)))
        graph.set_initializer(name, (w.astype(np.float64) * shaped).astype(np.float32))
    if len(pair.first.input) > 2 and pair.first.input[2]:
        bias = graph.const_value(pair.first.input[2])
        assert bias is not None
        graph.set_initializer(
            pair.first.input[2], (bias.astype(np.float64) * scale).astype(np.float32)
        )


def _spread(peak: np.ndarray) -> float:
    alive = peak[peak > 0]
    return float(alive.max() / alive.min()) if alive.size else 1.0
