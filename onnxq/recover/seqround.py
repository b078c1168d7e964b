"""Sequential AdaRound: each layer's rounding learned on the inputs it gets in the deployed
model, one layer at a time in graph order (``adaround_mode: sequential``).

:mod:`onnxq.recover.adaround` fits every layer on the float model's inputs, from one pass.
Here, for each quantized Conv/Gemm/MatMul in graph order, a Q/DQ copy of the model (the
activation ranges the run will write, prefix ones with ``calibration_mode: prefix``, and the
integers already learned for every earlier layer) runs on the calibration data up to the
layer's input, the float model up to the same tensor, and the rounding is fitted to the
"asymmetric" reconstruction of the AdaRound paper (sec. 4; BRECQ and QDrop use the same)::

    min  E || W_q x_q - W x_f ||^2

with ``x_q`` the layer's input in the quantized model and ``x_f`` in the float one
(:func:`onnxq.recover.rounding.problem` with the cross term of :class:`GramStats`).  A layer's
weights thus also take up part of the error its input carries from the activations and the
layers before it, and each layer sees what its predecessors already corrected, which fitting
every layer on quantized inputs from one pass does not (that over-corrects).

Two checks keep a layer from fitting noise: the rows of the even calibration batches fit the
rounding and those of the odd ones judge it (round-to-nearest stays unless the learned rounding
has the lower error there: a classifier's Gemm gets one row per image, fewer than its
weights), and the learned rounding is kept only if the model's output error on the odd
batches (:class:`onnxq.recover.outputs.OutputDrift`, as in sequential bias correction) drops.

Cost: per layer, two pruned passes over the calibration data (the float and the Q/DQ model
up to the layer's input; as many rows kept as in one-pass AdaRound), the layer's optimisation
as in one-pass AdaRound, and one full Q/DQ pass over the odd batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import batches_total, check_batch
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.recover.adaround import (
    ChosenWeight,
    LayerRounding,
    RoundingTarget,
    layer_progress,
    round_layer,
    rounding_targets,
)
from onnxq.recover.capture import DEFAULT_BATCHES, GramAccumulator, GramStats
from onnxq.recover.outputs import OutputDrift, pruned_session, run_session

# the weights take up the whole input error, its mean included (False: only its fluctuation;
# measured on mobilenet_v2 in docs/recovery.md)
FIX_INPUT_MEAN = True


def sequential_adaround(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> tuple[dict[str, ChosenWeight], list[LayerRounding]]:
    """Learn the rounding of every quantized Conv/Gemm/MatMul weight of ``model`` (not
    edited) layer by layer on the quantized prefix (``qparams``: the activation ranges);
    returns the chosen weights (by weight tensor; a layer left out rounds to nearest) and one
    entry per layer, in graph order."""
    from onnxq.materialize.qdq import materialize

    graph = ir.Graph(model)
    targets = _in_graph_order(graph, rounding_targets(graph, annotations, profile, weights))
    if not targets:
        return {}, []
    chosen: dict[str, ChosenWeight] = {}
    report: list[LayerRounding] = []

    def quantized(weights_now: dict[str, ChosenWeight]) -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        materialize(copy, annotations, qparams, profile, weights, weights_now)
        return copy

    budget = calibration.memory_budget_mb * 2**20
    judge = OutputDrift(model, data, inputs, calibration.max_batches, budget, every=(2, 1))
    current = quantized(chosen)
    error = judge(current)
    for target in layer_progress(targets, calibration.progress, "sequential adaround"):
        stats = capture_layer(
            model, current, target, data, inputs, options.adaround_rows, calibration.max_batches
        )
        if stats is None:
            continue
        weight, entry = round_layer(graph, target, stats[0], options, stats[1], FIX_INPUT_MEAN)
        if entry.kept != "learned":
            report.append(entry)
            continue
        trial = quantized({**chosen, target.layer.weight: weight})
        after = judge(trial)
        entry = replace(entry, model_error_nearest=error, model_error_learned=after)
        if after < error:
            chosen[target.layer.weight], current, error = weight, trial, after
        else:
            entry = replace(entry, kept="nearest")
        report.append(entry)
    return chosen, report


def _in_graph_order(graph: ir.Graph, targets: list[RoundingTarget]) -> list[RoundingTarget]:
    order = {node.name: index for index, node in enumerate(graph.nodes)}
    return sorted(targets, key=lambda t: order.get(t.layer.node, len(order)))


def capture_layer(
    float_model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    target: RoundingTarget,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    rows_per_layer: int,
    max_batches: int | None,
) -> tuple[GramStats, GramStats | None] | None:
    """The :class:`GramStats` of ``target``'s input in ``quantized`` (its Q/DQ copy, where
    the layer's node keeps its name) against ``float_model``: ``rows_per_layer`` rows
    sampled across the even batches (to fit on), as many across the odd ones (to judge on;
    None when there is one batch), or None (no batch, or the layer is not in ``quantized``)."""
    layer = target.layer
    reader = next((n for n in quantized.graph.node if n.name == layer.node), None)
    if reader is None:
        return None
    total = batches_total(data)
    total = min(total, max_batches) if total and max_batches else (total or max_batches)
    per_batch = max(1, math.ceil(2 * rows_per_layer / (total or DEFAULT_BATCHES)))
    halves = [GramAccumulator(layer, layer.input, reader.input[0], per_batch) for _ in "fj"]
    f_run = _runner(float_model, layer.input, "float")
    q_run = _runner(quantized, reader.input[0], "Q/DQ")
    for index, raw in enumerate(data):
        if max_batches is not None and index >= max_batches:
            break
        batch = check_batch(raw, inputs, index)
        halves[index % 2].add(index, f_run(batch, index), q_run(batch, index))
    fit, judge = (h.stats for h in halves)
    return None if fit is None else (fit, judge)


def _runner(model: onnx.ModelProto, tensor: str, what: str) -> Any:
    """A function of (batch, index) giving ``tensor`` of ``model`` on the batch (float32):
    a graph input straight from the batch, else a session pruned to ``tensor``."""
    if tensor in {i.name for i in model.graph.input}:
        return lambda batch, index: np.asarray(batch[tensor], dtype=np.float32)
    session = pruned_session(model, tensor, what)
    return lambda batch, index: run_session(session, tensor, batch, index)[0].astype(np.float32)


__all__ = ["capture_layer", "sequential_adaround"]
