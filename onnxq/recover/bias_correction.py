"""Empirical bias correction: remove the mean output shift that rounding the weights causes.

A per-channel int8 weight ``W_q`` is not ``W``: the rounding (and the clipping of the ``mse``
weight ranges) moves each output channel's mean by ``E[(W_q - W) x]``, a systematic error that
every following layer inherits (Nagel et al., "Data-Free Quantization Through Weight
Equalization and Bias Correction", 2019, its empirical variant; Sparsebit's bias correction).
This step measures that shift per output channel on the calibration data, with ``x`` the
layer's input in the float model, and subtracts it from the layer's float bias before Q/DQ are
placed.  The onnxruntime profile's int32 bias is derived from the corrected float bias.

How: a copy of the float model gets, next to every corrected layer, a twin that reads the same
input with the dequantized weight ``W_q``; one ``ReduceMean`` per layer leaves C numbers per
batch, so memory does not depend on the number of batches.  A channel is corrected only where
its shift stands out of the batch-to-batch noise (:data:`MIN_SIGNIFICANCE` standard errors):
a layer seen on a few samples (a classifier head) is not fitted to them.

Only the weight error is corrected.  Measured on the zoo models, also correcting the
activations' rounding and clipping this way (a quantized copy of the model, each layer against
a float twin on the same input) makes transformers and detectors worse (all_minilm_l6_v2's
hidden state 0.37 -> 0.88 relative error): the clipping error sits on a few tokens or pixels,
and a per-channel mean moves all of them.  Matching every layer's mean to the float model's in
one pass over-corrects (each layer also removes the shift its predecessors already removed);
doing it layer by layer costs one pass per layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.options import WeightOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.errors import InternalError, UnsupportedModelError
from onnxq.ir.ops import WEIGHTED_OPS
from onnxq.numerics.qparams import QParams, dequantize_weight, quantize_weight
from onnxq.place.annotations import Annotations

MIN_SIGNIFICANCE = 2.0  # a channel's shift must exceed this many standard errors
MIN_BATCHES = 2  # the noise estimate needs at least two batches


@dataclass(frozen=True)
class BiasCorrection:
    """The shift removed from one layer's bias, in the bias's own units."""

    node: str
    bias: str
    channels: int
    corrected: int  # channels whose shift stood out of the noise and was removed
    max_shift: float  # largest |shift| removed
    mean_abs_shift: float  # mean |shift| over the corrected channels
    bias_max_abs: float  # largest |bias| before the correction, for scale


@dataclass(frozen=True)
class _Target:
    node: onnx.NodeProto
    bias: str  # the constant that receives the correction
    bias_scale: float  # output shift -> bias units (1 / Gemm's beta)
    channel_axis: int  # of the node's output
    rank: int
    quantized_weight: np.ndarray  # dequantized W_q, exactly what materialize will store


@dataclass(frozen=True)
class BiasCorrectionPass:
    """What the bias correction pass did: its corrections, or why it did not run."""

    corrections: list[BiasCorrection] = field(default_factory=list)
    skipped: Literal["source read once", "model too large"] | None = None


def bias_correction_pass(
    model: onnx.ModelProto,
    annotations: Annotations,
    profile: BackendProfile,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None = None,
    chosen_weights: Mapping[str, tuple[QParams, np.ndarray]] | None = None,
) -> BiasCorrectionPass:
    """:func:`correct_biases` when the calibration data can be read again and the model's
    quantized weights fit next to its float ones; else the reason it is skipped."""
    if iter(data) is data:
        return BiasCorrectionPass(skipped="source read once")
    if ir.model_nbytes(model) >= ir.PROTO_LIMIT:
        return BiasCorrectionPass(skipped="model too large")
    return BiasCorrectionPass(
        correct_biases(
            model, annotations, profile, weights, data, inputs, max_batches, chosen_weights
        )
    )


def correct_biases(
    model: onnx.ModelProto,
    annotations: Annotations,
    profile: BackendProfile,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None = None,
    chosen_weights: Mapping[str, tuple[QParams, np.ndarray]] | None = None,
) -> list[BiasCorrection]:
    """Subtract each quantized layer's mean output shift ``E[(W_q - W) x]``, measured on
    ``data``, from its float bias in ``model`` (edited in place); returns what was corrected.

    Layers whose bias is not a float initializer of their own (no bias, a shared one, a
    MatMul not followed by a constant Add) are left alone.  ``chosen_weights``: integer
    weights decided before (AdaRound; weight tensor -> (qparams, integer values)), which
    ``W_q`` then is; other weights are rounded to nearest.
    """
    graph = ir.Graph(model)
    targets = _targets(graph, annotations, profile, weights, chosen_weights or {})
    if not targets:
        return []
    probe, outputs = _probe_model(model, targets)
    shifts = _measure(probe, outputs, data, inputs, max_batches)
    corrections = []
    for target, (shift, keep) in zip(targets, shifts, strict=True):
        if not keep.any():
            continue
        bias = graph.const_value(target.bias)
        assert bias is not None
        applied = np.where(keep, shift, 0.0) * target.bias_scale
        corrected = bias.astype(np.float64) - applied.reshape(bias.shape)
        graph.set_initializer(target.bias, corrected.astype(bias.dtype))
        magnitudes = np.abs(applied[keep])
        corrections.append(
            BiasCorrection(
                target.node.name,
                target.bias,
                int(shift.size),
                int(keep.sum()),
                float(magnitudes.max()),
                float(magnitudes.mean()),
                float(np.abs(bias).max(initial=0.0)),
            )
        )
    return corrections


# --------------------------------------------------------------------------- targets
def _targets(
    graph: ir.Graph,
    annotations: Annotations,
    profile: BackendProfile,
    options: WeightOptions,
    chosen: Mapping[str, tuple[QParams, np.ndarray]],
) -> list[_Target]:
    """Quantized weighted layers whose bias is a float initializer of their own."""
    from onnxq.materialize.weight_qparams import weight_limits, weight_qparams_of

    weights = {
        node_name: ann
        for ann in annotations.of_kind("weight")
        for node_name, index in ann.consumers
        if index == 1
    }
    limits = weight_limits(graph, annotations, profile)
    out = []
    for node in graph.nodes:
        if node.op_type not in WEIGHTED_OPS or node.name not in weights:
            continue
        ann = weights[node.name]
        where = _bias_of(graph, node)
        w = graph.const_value(node.input[1])
        if where is None or w is None:
            continue
        bias, axis, rank, scale = where
        if ann.tensor in chosen:
            qp, values = chosen[ann.tensor]
            dequantized = dequantize_weight(values, qp)
        else:
            qmax = limits[ann.tensor]
            qp = weight_qparams_of(ann, w, qmax, profile, options)
            dequantized = dequantize_weight(quantize_weight(w, qp, qmax), qp)
        out.append(_Target(node, bias, scale, axis, rank, dequantized))
    return out


def _bias_of(graph: ir.Graph, node: onnx.NodeProto) -> tuple[str, int, int, float] | None:
    """(bias constant, output channel axis, output rank, shift-to-bias factor) or None."""
    w = graph.const_value(node.input[1])
    shape = graph.shape(node.output[0])
    if node.op_type == "MatMul":
        readers = graph.consumers.get(node.output[0], [])
        if (
            shape is None
            or len(shape) < 2
            or len(readers) != 1
            or readers[0][0].op_type != "Add"
            or node.output[0] in graph.graph_outputs
        ):
            return None
        add, index = readers[0]
        bias, rank, scale = add.input[1 - index], len(shape), 1.0
    elif node.op_type == "Gemm":
        beta = float(ir.node_attrs(node).get("beta", 1.0))  # type: ignore[arg-type]
        if len(node.input) < 3 or not node.input[2] or beta == 0.0:
            return None
        bias, rank, scale = node.input[2], 2, 1.0 / beta
    else:  # Conv, ConvTranspose: output rank = weight rank
        if len(node.input) < 3 or not node.input[2] or w is None:
            return None
        bias, rank, scale = node.input[2], w.ndim, 1.0
    axis = rank - 1 if node.op_type == "MatMul" else 1
    value = graph.const_value(bias)
    if (
        bias not in graph.initializers
        or value is None
        or value.dtype != np.float32
        or len(graph.consumers.get(bias, [])) != 1
        or value.ndim > rank
    ):
        return None
    channels = shape[axis] if shape is not None and len(shape) == rank else None
    if isinstance(channels, int) and value.size != channels:
        return None
    if value.ndim > 1 and (value.shape[-1] != value.size or axis != rank - 1):
        return None  # not a per-channel vector along the output's channel axis
    return bias, axis, rank, scale


# --------------------------------------------------------------------------- measuring
def _probe_model(
    model: onnx.ModelProto,
    targets: list[_Target],
) -> tuple[onnx.ModelProto, list[tuple[str, str]]]:
    """A copy of ``model`` whose outputs are, per target, the per-channel mean of
    (twin with ``W_q`` - layer) over one batch and the number of values behind each mean."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = ir.Graph(probe)
    opset = ir.opset_version(probe)
    outputs = []
    for t in targets:
        node = t.node
        weight = graph.add_initializer(
            graph.unique_name(f"{node.input[1]}_quantized_twin"), t.quantized_weight
        )
        twin = graph.unique_name(f"{node.output[0]}_quantized_twin")
        graph.add_node(
            node.op_type,
            [node.input[0], weight, *node.input[2:]],
            [twin],
            graph.unique_name(f"{node.name}_quantized_twin"),
            **ir.node_attrs(node),
        )
        diff = graph.unique_name(f"{node.name}_weight_error")
        graph.add_node("Sub", [twin, node.output[0]], [diff], graph.unique_name(diff))
        mean = graph.unique_name(f"{node.name}_weight_error_mean")
        axes = [a for a in range(t.rank) if a != t.channel_axis]
        if opset >= 18:
            axes_name = graph.add_initializer(
                graph.unique_name(f"{mean}_axes"), np.asarray(axes, dtype=np.int64)
            )
            graph.add_node(
                "ReduceMean", [diff, axes_name], [mean], graph.unique_name(mean), keepdims=0
            )
        else:
            graph.add_node(
                "ReduceMean", [diff], [mean], graph.unique_name(mean), axes=axes, keepdims=0
            )
        size = graph.unique_name(f"{node.name}_weight_error_size")
        graph.add_node("Size", [diff], [size], graph.unique_name(size))
        count = graph.unique_name(f"{node.name}_weight_error_count")
        graph.add_node("Cast", [size], [count], graph.unique_name(count), to=onnx.TensorProto.FLOAT)
        outputs.append((mean, count))
    # the new nodes come after everything they read, so the order is already topological
    # (commit() would drop them: no graph output reads them until the session exposes them)
    return probe, outputs


def _measure(
    probe: onnx.ModelProto,
    outputs: list[tuple[str, str]],
    data: Iterable[Batch],
    inputs: list[InputSpec],
    max_batches: int | None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per target: the mean shift per channel over all values seen, and which channels' shift
    exceeds :data:`MIN_SIGNIFICANCE` standard errors of the per-batch means."""
    from onnxq.calibrate.session import augmented_session

    names = [n for pair in outputs for n in pair]
    try:
        session = augmented_session(probe, ir.Graph(probe), names, optimize=False)
    except UnsupportedModelError as exc:  # the float model itself loaded for calibration
        raise InternalError(
            f"onnxruntime cannot load onnxq's bias-correction copy of the model: {exc}",
            onnxruntime_failed=True,
        ) from None
    weighted = [np.zeros(0)] * len(outputs)
    weights = [0.0] * len(outputs)
    sums = [np.zeros(0)] * len(outputs)
    squares = [np.zeros(0)] * len(outputs)
    batches = 0
    for index, raw in enumerate(data):
        if max_batches is not None and index >= max_batches:
            break
        batch = check_batch(raw, inputs, index)
        try:
            values = session.run(names, batch)
        except Exception as exc:  # the float model ran on this batch during calibration
            raise InternalError(
                f"onnxruntime fails on onnxq's bias-correction copy of the model (each "
                f"corrected layer with a twin) on calibration batch {index}: "
                f"{' '.join(str(exc).split())[:300]}",
                onnxruntime_failed=True,
            ) from None
        for i in range(len(outputs)):
            mean = np.asarray(values[2 * i], dtype=np.float64).reshape(-1)
            count = float(values[2 * i + 1]) / max(mean.size, 1)
            if batches == 0:
                weighted[i], sums[i], squares[i] = (np.zeros_like(mean) for _ in range(3))
            weighted[i] = weighted[i] + count * mean
            weights[i] += count
            sums[i] = sums[i] + mean
            squares[i] = squares[i] + mean * mean
        batches += 1
    out = []
    for i in range(len(outputs)):
        shift = weighted[i] / weights[i] if weights[i] > 0 else weighted[i]
        out.append((shift, _significant(shift, sums[i], squares[i], batches)))
    return out


def _significant(
    shift: np.ndarray, sums: np.ndarray, squares: np.ndarray, batches: int
) -> np.ndarray:
    """Channels whose shift exceeds the standard error of the per-batch means."""
    if batches < MIN_BATCHES:
        return np.zeros(shift.shape, dtype=bool)
    mean = sums / batches
    var = np.maximum(squares / batches - mean * mean, 0.0) * batches / (batches - 1)
    return np.abs(shift) > MIN_SIGNIFICANCE * np.sqrt(var / batches)
