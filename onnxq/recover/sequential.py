"""Sequential bias correction: each layer's mean output shift, measured with every earlier
layer already quantized and corrected, removed from its bias, one layer at a time, and kept
only where it lowers the model's output error on the calibration data.

The deployed model's error is not zero-mean: a ReLU6 output rounded to a symmetric per-tensor
grid, a clipped range, an upstream shift all move the mean of the next layer's output
(``onnxq.recover.bias_correction`` sees only the weights' part, on float inputs).  For each
quantized Conv/ConvTranspose/Gemm/MatMul with a float bias of its own, in graph order, a Q/DQ copy
of the model (biases corrected so far) and the float model run on the calibration data up to the
layer (the rest pruned); per channel, the mean difference over the positions where the float
value is in the range a following Relu/Clip passes is the shift.  Channels whose shift exceeds
:data:`MIN_SIGNIFICANCE` standard errors of the per-batch means are corrected, then the whole
model is scored (:class:`OutputDrift`) and the correction undone unless the error went down.
The shifts are measured on the even calibration batches and judged on the odd ones: judged on
the batches they were measured on, corrections that only fit those batches pass the check.

One layer at a time, because a layer's shift includes what its predecessors' shifts cause
(correcting all from one pass over-corrects); the check, because a mean shift is not always a
bias worth removing (mobilenet_v2's deeper blocks: the error sits on few clipped positions,
and moving the channel's mean hurts the next layers; docs/recovery.md has the numbers).  Cost:
per layer two pruned passes and one full pass over the calibration data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.options import WeightOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.ir.ops import WEIGHTED_OPS
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.recover.bias_correction import MIN_BATCHES, _bias_of
from onnxq.recover.outputs import OutputDrift, pruned_session, run_session
from onnxq.runtime.progress import counted

Bounds = tuple[float | None, float | None]
MIN_SIGNIFICANCE = 2.0  # a channel's shift must exceed this many standard errors
JUDGED = 1  # batches with an odd index judge a correction; the even ones measure it


@dataclass(frozen=True)
class Layer:
    """One layer the step may correct: its node, its bias constant, and its output's channel
    axis and rank."""

    node: onnx.NodeProto
    bias: str
    channel_axis: int
    rank: int
    bias_scale: float  # output shift -> bias units (1 / Gemm's beta)
    passed: Bounds | None  # where a following Relu/Clip passes values; None: no activation


@dataclass(frozen=True)
class LayerShift:
    """One layer: its shift (in the output's units), and whether removing it lowered the
    model's output error on the calibration data (only then is it kept)."""

    node: str
    channels: int
    significant: int  # channels whose shift stood out of the batch-to-batch spread
    max_shift: float  # largest |shift| among them
    mean_abs_shift: float  # mean |shift| over them
    error_before: float | None = None  # the model's output error without / with the change
    error_after: float | None = None  # (None: no channel to correct, nothing tried)
    kept: bool = False

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "node": self.node,
            "channels": self.channels,
            "significant": self.significant,
            "max_shift": round(self.max_shift, 6),
            "mean_abs_shift": round(self.mean_abs_shift, 6),
            "error_before": _rounded(self.error_before),
            "error_after": _rounded(self.error_after),
            "kept": self.kept,
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


QuantizedCopy = Callable[[onnx.ModelProto], onnx.ModelProto]


def sequential_correction(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None = None,
    chosen_weights: Mapping[str, tuple[QParams, np.ndarray]] | None = None,
    progress: bool = False,
    memory_budget: int = 2**30,
) -> list[LayerShift]:
    """Correct the float biases of ``model`` (edited in place) layer by layer so that each
    quantized layer's per-channel output mean, with everything before it quantized as
    ``annotations``/``qparams``/``chosen_weights`` place it, matches the float model's on
    ``data``.  Returns one record per layer looked at, in topological order."""
    from onnxq.materialize.qdq import materialize

    chosen = dict(chosen_weights or {})

    def quantized(float_model: onnx.ModelProto) -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(float_model)
        materialize(copy, annotations, qparams, profile, weights, chosen)
        return copy

    return correct_in_order(
        model, layers(model, annotations), quantized, data, inputs, max_batches, progress,
        memory_budget,
    )  # fmt: skip


def layers(model: onnx.ModelProto, annotations: Annotations) -> list[Layer]:
    """The layers with a quantized weight and a float bias of their own, in graph order."""
    graph = ir.Graph(model)
    weighted = {
        node for ann in annotations.of_kind("weight") for node, index in ann.consumers if index == 1
    }
    out = []
    for node in graph.nodes:
        if node.op_type not in WEIGHTED_OPS or node.name not in weighted:
            continue
        where = _bias_of(graph, node)
        if where is not None:
            bias, axis, rank, scale = where
            out.append(Layer(node, bias, axis, rank, scale, _passed(graph, node.output[0])))
    return out


def _passed(graph: ir.Graph, tensor: str) -> Bounds | None:
    """The interval a Relu or Clip that alone reads ``tensor`` lets through (None: no such
    activation; a bound None: open on that side)."""
    readers = graph.consumers.get(tensor, [])
    if len(readers) != 1 or tensor in graph.graph_outputs:
        return None
    node = readers[0][0]
    if node.op_type == "Relu":
        return 0.0, None
    if node.op_type == "Clip":
        return graph.clip_bounds(node)
    return None


def correct_in_order(
    model: onnx.ModelProto,
    targets: list[Layer],
    quantized: QuantizedCopy,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None,
    progress: bool = False,
    memory_budget: int = 2**30,
) -> list[LayerShift]:
    """The loop of :func:`sequential_correction`; ``quantized`` makes the Q/DQ copy of the
    (partly corrected) float model.  A layer's correction is kept only when it lowers the
    model's output error (:class:`OutputDrift`) on the calibration data."""
    original = onnx.ModelProto()  # the float outputs to match: before any correction
    original.CopyFrom(model)
    graph = ir.Graph(model)
    judge = OutputDrift(original, data, inputs, max_batches, memory_budget, every=(2, JUDGED))
    current = judge(quantized(model)) if targets else 0.0
    done = []
    for index in _progress(len(targets), progress):
        target = targets[index]
        differences = _differences(original, quantized(model), target, data, inputs, max_batches)
        shift, keep = _significant_shift(differences)
        removed = np.abs(shift[keep])
        record = LayerShift(
            target.node.name, int(shift.size), int(keep.sum()),
            float(removed.max(initial=0.0)), float(removed.mean()) if removed.size else 0.0,
        )  # fmt: skip
        if keep.any():
            bias = graph.const_value(target.bias)
            assert bias is not None
            applied = np.where(keep, shift, 0.0) * target.bias_scale
            corrected = bias.astype(np.float64) - applied.reshape(bias.shape)
            graph.set_initializer(target.bias, corrected.astype(bias.dtype))
            error = judge(quantized(model))
            record = replace(record, error_before=current, error_after=error, kept=error < current)
            if record.kept:
                current = error
            else:
                graph.set_initializer(target.bias, bias)
        done.append(record)
    return done


def _significant_shift(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean shift per channel, which channels exceed :data:`MIN_SIGNIFICANCE` standard
    errors of the per-batch means) from per-batch mean differences (batches x channels;
    NaN where a batch had no value of that channel in the active range)."""
    seen = ~np.isnan(differences)
    count = seen.sum(axis=0)
    filled = np.where(seen, differences, 0.0)
    shift = filled.sum(axis=0) / np.maximum(count, 1)
    spread = np.sqrt(
        ((filled - shift) ** 2 * seen).sum(axis=0) / np.maximum(count - 1, 1)
    ) / np.sqrt(np.maximum(count, 1))
    keep = (count >= MIN_BATCHES) & (np.abs(shift) > MIN_SIGNIFICANCE * spread)
    return np.where(count > 0, shift, 0.0), keep


def _differences(
    original: onnx.ModelProto,
    quantized: onnx.ModelProto,
    target: Layer,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None,
) -> np.ndarray:
    """Per batch and channel, the mean of (quantized - float) output of ``target`` over the
    positions where the float output is in the range its activation passes (batches x
    channels; NaN where there is none)."""
    tensor = target.node.output[0]
    sessions = [
        pruned_session(m, tensor, what) for m, what in ((original, "float"), (quantized, "Q/DQ"))
    ]
    rows = []
    for index, raw in enumerate(data):
        if max_batches is not None and index >= max_batches:
            break
        if index % 2 == JUDGED:
            continue  # the batches the output error is judged on
        batch = check_batch(raw, inputs, index)
        exact, rounded = (run_session(s, tensor, batch, index)[0] for s in sessions)
        exact = np.moveaxis(exact, target.channel_axis, -1).reshape(
            -1, exact.shape[target.channel_axis]
        )
        rounded = np.moveaxis(rounded, target.channel_axis, -1).reshape(exact.shape)
        active = np.ones(exact.shape, dtype=bool)
        if target.passed is not None:
            low, high = target.passed
            if low is not None:
                active &= exact > low
            if high is not None:
                active &= exact < high
        count = active.sum(axis=0)
        total = np.where(active, rounded - exact, 0.0).sum(axis=0)
        rows.append(np.where(count > 0, total / np.maximum(count, 1), np.nan))
    return np.stack(rows) if rows else np.zeros((0, 0))


def _progress(count: int, enabled: bool) -> Iterable[int]:
    """``range(count)``, with a progress bar when ``enabled``."""
    return counted(range(count), "sequential correction", enabled, count, unit="layer")
