"""The range a quantized model chose for an activation next to the values it meets: for the
``analyze`` page, the histogram of the float model's values of each quantized input of the
worst layers, with the range its QuantizeLinear encodes (``scale * (qmin - zero_point)`` to
``scale * (qmax - zero_point)``) and the share of values that range clips.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.calibrate.session import augmented_session, run_batch
from onnxq.data.sources import Batch, check_batch, model_inputs

BINS = 64


@dataclass(frozen=True)
class ChosenRange:
    """An activation the quantized model quantizes per tensor, and the range it encodes."""

    tensor: str
    low: float
    high: float


@dataclass(frozen=True)
class TensorRange:
    """A quantized activation's float values (a histogram over ``edges``) and its range."""

    tensor: str
    low: float
    high: float
    observed_min: float
    observed_max: float
    edges: tuple[float, ...]
    counts: tuple[int, ...]
    clipped: float  # share of the values outside [low, high]


def quantized_inputs(quant_model: onnx.ModelProto) -> dict[str, list[ChosenRange]]:
    """Node name -> the activations it reads through QuantizeLinear -> DequantizeLinear with
    a per-tensor integer scale (top-level graph; weights, which have no QuantizeLinear, are
    left out)."""
    graph = ir.Graph(quant_model)
    out: dict[str, list[ChosenRange]] = {}
    for node in graph.nodes:
        for name in node.input:
            chosen = _chosen_range(graph, name)
            if chosen is not None:
                out.setdefault(node.name, []).append(chosen)
    return out


def _chosen_range(graph: ir.Graph, tensor: str) -> ChosenRange | None:
    dq = graph.producer.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q = graph.producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3:
        return None
    scale, zero_point = graph.const_value(q.input[1]), graph.const_value(q.input[2])
    if scale is None or zero_point is None or scale.size != 1 or zero_point.dtype.kind not in "iu":
        return None
    info = np.iinfo(zero_point.dtype)
    s, z = float(scale.ravel()[0]), int(zero_point.ravel()[0])
    return ChosenRange(q.input[0], s * (info.min - z), s * (info.max - z))


def tensor_ranges(
    float_model: onnx.ModelProto,
    chosen: list[ChosenRange],
    batches: Iterable[Batch],
    max_batches: int,
) -> list[TensorRange]:
    """Histograms of ``chosen``'s tensors in ``float_model`` over up to ``max_batches``
    batches, on bins that span both the observed values and the chosen range."""
    graph = ir.Graph(float_model)
    wanted = [c for c in chosen if c.tensor in graph.producer or c.tensor in graph.graph_inputs]
    if not wanted:
        return []
    names = list(dict.fromkeys(c.tensor for c in wanted))
    inputs = model_inputs(graph)
    held = [check_batch(b, inputs, i) for i, b in enumerate(itertools.islice(batches, max_batches))]
    session = augmented_session(float_model, graph, names)
    values: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for index, batch in enumerate(held):
        got = run_batch(session, names, batch, index, "float")
        for name, value in zip(names, got, strict=True):
            finite = value[np.isfinite(value)].astype(np.float64).ravel()
            values[name].append(finite[:: max(1, finite.size // 65536)])  # a bounded sample
    return [_histogram(c, np.concatenate(values[c.tensor] or [np.zeros(0)])) for c in wanted]


def _histogram(chosen: ChosenRange, values: np.ndarray) -> TensorRange:
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    left, right = min(lo, chosen.low), max(hi, chosen.high)
    if right <= left:
        right = left + 1.0
    counts, edges = np.histogram(values, bins=BINS, range=(left, right))
    outside = (values < chosen.low) | (values > chosen.high)
    return TensorRange(
        chosen.tensor,
        chosen.low,
        chosen.high,
        lo,
        hi,
        tuple(float(e) for e in edges),
        tuple(int(c) for c in counts),
        float(outside.mean()) if values.size else 0.0,
    )
