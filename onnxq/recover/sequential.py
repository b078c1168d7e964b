"""Sequential bias correction: each layer's mean output shift, measured with every earlier
layer already quantized and corrected, removed from its bias, one layer at a time.

The quantized model's error is not zero-mean: rounding a ReLU6 output to a per-tensor
symmetric grid, clipping a range, rounding a depthwise kernel of nine weights all move the
mean of the next layer's output, and the following layers inherit the shift.  The weight-only
bias correction (``onnxq.bias_correction``) sees only the weights' part, on float inputs.
This step measures the whole shift where the deployed model has it: for each quantized
Conv/ConvTranspose/Gemm/MatMul with a float bias of its own, in topological order, a copy of
the model with Q/DQ placed (with the biases corrected so far) runs on the calibration data up
to that layer (the rest of the graph is pruned), and the per-channel mean of the layer's
output is compared with the float model's on the same batches.  A channel's shift is
subtracted from its bias only where it stands out of the batch-to-batch spread
(:data:`MIN_SIGNIFICANCE` standard errors): a shift that depends on the image is not a
bias, and correcting it moves every other image (all layers at once, or without that test,
makes mobilenet_v2 worse, see docs/accuracy.md).

Doing it one layer at a time matters: a layer's measured shift includes what its
predecessors' shifts cause, and correcting every layer from one pass over-corrects.  The cost
is one pass over the calibration data per corrected layer, each through the model up to that
layer only (about half the model on average), plus one float pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.bias_correction import CORRECTED_OPS, MIN_BATCHES, _bias_of
from onnxq.data import check_batch
from onnxq.errors import InternalError, UnsupportedModelError
from onnxq.inputs import Batch, InputSpec
from onnxq.observers import QParams
from onnxq.options import WeightOptions
from onnxq.place.annotations import Annotations

Bounds = tuple[float | None, float | None]
MIN_SIGNIFICANCE = 2.0  # a channel's shift must exceed this many standard errors


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
    from onnxq.materialize import materialize

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
        if node.op_type not in CORRECTED_OPS or node.name not in weighted:
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
    model's output error (:class:`OutputError`) on the calibration data."""
    original = onnx.ModelProto()  # the float outputs to match: before any correction
    original.CopyFrom(model)
    graph = ir.Graph(model)
    judge = OutputError(original, data, inputs, max_batches, memory_budget)
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


class OutputError:
    """The error of a model's outputs against the float model's on the calibration batches:
    per output, the sum of squared differences over the sum of squared float values, summed
    over the outputs.  The float outputs are kept for the batches that fit ``memory_budget``
    (at least one); only those batches are scored."""

    def __init__(
        self,
        original: onnx.ModelProto,
        data: Iterable[Batch],
        inputs: list[InputSpec],
        max_batches: int | None,
        memory_budget: int,
    ) -> None:
        session = _session(original, None, "float")
        self._batches: list[Batch] = []
        self._reference: list[list[np.ndarray]] = []
        used = 0
        for index, raw in enumerate(data):
            if max_batches is not None and index >= max_batches:
                break
            batch = check_batch(raw, inputs, index)
            outputs = _run(session, None, batch, index)
            used += sum(o.nbytes for o in outputs)
            if self._batches and used > memory_budget:
                break
            self._batches.append(batch)
            self._reference.append(outputs)

    def __call__(self, model: onnx.ModelProto) -> float:
        """The error of ``model`` (its outputs in the float model's order)."""
        session = _session(model, None, "Q/DQ")
        squared: list[float] = []
        norms: list[float] = []
        for index, (batch, reference) in enumerate(
            zip(self._batches, self._reference, strict=True)
        ):
            for k, (got, want) in enumerate(
                zip(_run(session, None, batch, index), reference, strict=True)
            ):
                if k == len(squared):
                    squared.append(0.0)
                    norms.append(0.0)
                squared[k] += float(np.square(got - want).sum())
                norms[k] += float(np.square(want).sum())
        return sum(s / n if n > 0 else s for s, n in zip(squared, norms, strict=True))


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
    sessions = [_session(m, tensor, what) for m, what in ((original, "float"), (quantized, "Q/DQ"))]
    rows = []
    for index, raw in enumerate(data):
        if max_batches is not None and index >= max_batches:
            break
        batch = check_batch(raw, inputs, index)
        exact, rounded = (_run(s, tensor, batch, index)[0] for s in sessions)
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


def _session(model: onnx.ModelProto, tensor: str | None, what: str) -> Any:
    """An unoptimized onnxruntime session of ``model``, pruned to compute ``tensor`` alone
    when given."""
    from onnxq.calibrate import make_session

    try:
        if tensor is None:
            return make_session(model, optimize=False)
        output = ir.Graph(model).value_info(tensor)
        with ir.pruned(model, [tensor]), ir.with_outputs(model, [output]) as view:
            return make_session(view, optimize=False)
    except UnsupportedModelError as exc:  # the float model itself loaded for calibration
        raise InternalError(
            f"onnxruntime cannot load onnxq's {what} copy for sequential correction: {exc}",
            onnxruntime_failed=True,
        ) from None


def _run(session: Any, tensor: str | None, batch: Batch, index: int) -> list[np.ndarray]:
    """``tensor`` (None: every output) on one batch, as float64."""
    try:
        values = session.run([tensor] if tensor is not None else None, batch)
    except Exception as exc:  # the float model ran on this batch during calibration
        raise InternalError(
            f"onnxruntime fails on onnxq's sequential-correction copy on calibration batch "
            f"{index}: {' '.join(str(exc).split())[:300]}",
            onnxruntime_failed=True,
        ) from None
    return [np.asarray(v, dtype=np.float64) for v in values]


def _progress(count: int, enabled: bool) -> Iterable[int]:
    """``range(count)``, with a progress bar when ``enabled`` and tqdm is installed."""
    if not enabled:
        return range(count)
    try:
        from tqdm import tqdm
    except ImportError:
        return range(count)
    return tqdm(range(count), desc="sequential correction", unit="layer", leave=False)
