"""AdaRound as a pipeline stage: learn the integer weights of every quantized Conv, Gemm and
MatMul from the calibration data, before Q/DQ are placed.

Each layer's rounding (:mod:`onnxq.recover.rounding`) minimises the error of its output on the
float model's inputs to it, which one streaming pass collects (:func:`onnxq.recover.capture.
capture_grams`, a fixed sample of rows per layer).  The scales stay those of round-to-nearest;
only the rounding of each weight changes, by at most one step.  A layer whose learned rounding
is not better than round-to-nearest on the captured rows keeps round-to-nearest, so no layer's
output error grows.  :func:`onnxq.materialize.qdq.materialize` writes the chosen integers.

The inputs are the float model's, not the quantized model's ("asymmetric" reconstruction):
captured in one pass, each layer would fit its rounding to the error that round-to-nearest
upstream layers send it, and every layer would then correct for errors its predecessors
already took up.  Measured on mobilenet_v2 that over-correction took the logits' cosine from
0.984 to 0.928; done right it needs one pass over the data per layer.

Cost: one pass over the calibration data (two models), then per layer ``steps`` products of
``[outputs, K] @ [K, K]`` (``K``: values per output, e.g. ``C_in * kh * kw / groups``).  A
layer larger than :data:`MAX_MACS` multiply-adds over all steps takes fewer steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.numerics.qparams import QParams, weight_qparams
from onnxq.place.annotations import Annotations
from onnxq.recover.capture import GramStats, capture_grams
from onnxq.recover.engines import get_engine
from onnxq.recover.layers import LAYER_OPS, LinearLayer, linear_layer
from onnxq.recover.rounding import learn_rounding, problem
from onnxq.runtime.progress import counted

MAX_MACS = 2**38  # multiply-adds one layer may spend over all its steps (~30 s on a core)
MIN_STEPS = 100


class ChosenWeight(NamedTuple):
    """The integer weight a layer will be stored with, and its qparams (the form
    :func:`onnxq.materialize.qdq.materialize` takes)."""

    qparams: QParams
    values: np.ndarray  # int8, the weight's own shape


@dataclass(frozen=True)
class LayerRounding:
    """What AdaRound did to one layer: output MSE (per output value, over the captured rows)
    of round-to-nearest and of the learned rounding, and which one the layer keeps."""

    node: str
    weight: str
    rows: int
    steps: int
    mse_nearest: float
    mse_learned: float
    kept: str  # "learned" or "nearest"
    changed: float  # share of the integers that differ from round-to-nearest
    # sequential mode: the model's output error with this layer rounded to nearest / learned
    # (None: not measured, the learned rounding lost on the layer's own rows already)
    model_error_nearest: float | None = None
    model_error_learned: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class RoundingTarget:
    layer: LinearLayer
    qparams: QParams
    qmax: int


def adaround(
    model: onnx.ModelProto,
    annotations: Annotations,
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> tuple[dict[str, ChosenWeight], list[LayerRounding]]:
    """Learn the rounding of every quantized Conv/Gemm/MatMul weight of ``model`` (not
    edited); returns the chosen weights (by weight tensor) and one entry per layer."""
    graph = ir.Graph(model)
    targets = rounding_targets(graph, annotations, profile, weights)
    if not targets:
        return {}, []
    stats = capture_grams(
        model,
        [t.layer for t in targets],
        data,
        inputs,
        rows_per_layer=options.adaround_rows,
        max_batches=calibration.max_batches,
        memory_budget=calibration.memory_budget_mb * 2**20,
        progress=calibration.progress,
    )
    chosen: dict[str, ChosenWeight] = {}
    report: list[LayerRounding] = []
    for target in layer_progress(targets, calibration.progress):
        if target.layer.node in stats:
            weight, entry = round_layer(graph, target, stats[target.layer.node], options)
            chosen[target.layer.weight] = weight
            report.append(entry)
    return chosen, report


def round_layer(
    graph: ir.Graph,
    target: RoundingTarget,
    stats: GramStats,
    options: RecoveryOptions,
    judge: GramStats | None = None,
    fix_input_mean: bool = True,
) -> tuple[ChosenWeight, LayerRounding]:
    """One layer's learned rounding (or round-to-nearest, when that is as good), fitted on
    ``stats`` and compared with round-to-nearest on ``judge`` (default: ``stats``) rows;
    ``fix_input_mean``: see :func:`onnxq.recover.rounding.problem`."""
    layer = target.layer
    weight = graph.const_value(layer.weight)
    assert weight is not None
    scales = _scale_matrix(layer, target.qparams, weight)
    p = problem(layer.matrix(weight), scales, stats, target.qmax, fix_input_mean)
    nearest = p.nearest()
    steps = _steps(layer, options.adaround_steps)
    learned = learn_rounding(p, steps, get_engine(options.adaround_engine).layer_in_torch)
    if judge is not None:
        p = problem(layer.matrix(weight), scales, judge, target.qmax, fix_input_mean)
    mse_nearest, mse_learned = p.error(nearest), p.error(learned)
    better = mse_learned < mse_nearest
    values = layer.from_matrix(learned if better else nearest).astype(np.int8)
    entry = LayerRounding(
        layer.node,
        layer.weight,
        stats.rows,
        steps,
        mse_nearest,
        mse_learned,
        "learned" if better else "nearest",
        float((learned != nearest).mean()),
    )
    return ChosenWeight(target.qparams, values), entry


def rounding_targets(
    graph: ir.Graph, annotations: Annotations, profile: BackendProfile, weights: WeightOptions
) -> list[RoundingTarget]:
    """Quantized Conv/Gemm/MatMul weights read by exactly one layer, in graph order."""
    from onnxq.materialize.weight_qparams import weight_limits

    limits = weight_limits(graph, annotations, profile)
    by_node = {n.name: n for n in graph.nodes}
    out = []
    for ann in annotations.of_kind("weight"):
        if len(ann.consumers) != 1 or ann.consumers[0][1] != 1:
            continue
        node = by_node.get(ann.consumers[0][0])
        if node is None or node.op_type not in LAYER_OPS:
            continue
        if len(graph.consumers.get(ann.tensor, [])) != 1:
            continue
        layer = linear_layer(graph, node)
        value = graph.const_value(ann.tensor)
        if isinstance(layer, str) or value is None:
            continue
        if ann.axis is not None and ann.axis != layer.channel_axis():
            continue
        qmax = limits[ann.tensor]
        qp = weight_qparams(value, ann.axis, qmax, weights.weight_method)
        out.append(RoundingTarget(layer, qp, qmax))
    return out


def _scale_matrix(layer: LinearLayer, qp: QParams, weight: np.ndarray) -> np.ndarray:
    """The weight's scales as ``[groups, outputs per group, 1]``."""
    scale = np.broadcast_to(np.asarray(qp.scale, dtype=np.float32).reshape(-1), (layer.outputs,))
    per_group = layer.matrix(weight).shape[1]
    return np.ascontiguousarray(scale).reshape(-1, per_group, 1)


def _steps(layer: LinearLayer, steps: int) -> int:
    """``steps``, fewer for a layer whose steps would pass :data:`MAX_MACS`."""
    per_step = layer.outputs * layer.row_length**2
    return max(min(steps, MAX_MACS // max(per_step, 1)), min(steps, MIN_STEPS))


def layer_progress(
    targets: list[RoundingTarget], enabled: bool, label: str = "adaround"
) -> Iterable[RoundingTarget]:
    """``targets``, with a progress bar counting the layers when ``enabled``."""
    return counted(targets, label, enabled, len(targets), unit="layer")


__all__ = [
    "ChosenWeight",
    "LayerRounding",
    "RoundingTarget",
    "adaround",
    "layer_progress",
    "round_layer",
    "rounding_targets",
]
