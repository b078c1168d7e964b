"""Choosing each layer's integer weights: the algorithms run layer group by layer group.

Layers that read the same input form a group.  With calibration data the groups are visited in
graph order: a :class:`~onnxq.weightonly.layerwise.LayerwiseRunner` computes the group's input
with every earlier group already quantized, its statistics (``X^T X``, mean ``|x|``) are
streamed, and the group's layers are quantized by their algorithm; their dequantized weights
then feed the later stages.  Without data every layer is rounded to nearest on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import Batch
from onnxq.numerics.blocks import BlockFormat, BlockQuantized, output_error, quantize_rtn
from onnxq.runtime.blas import blas_threads
from onnxq.weightonly.awq import search_scales
from onnxq.weightonly.gptq import Factor, gptq
from onnxq.weightonly.layerwise import LayerwiseRunner
from onnxq.weightonly.stats import InputStats
from onnxq.weightonly.targets import Layer, weight_matrix

GPTQ_DAMP = 0.01
GPTQ_ACT_ORDER = True  # measured: smollm2 int4 block 128 proxy perplexity 21.90 -> 21.02
# a default int4 layer whose relative output error on the calibration data passes this keeps
# 8 bits (None: never). Measured on smollm2_135m, block 128, GPTQ: 0.005 promotes ~10% of the
# weights (most value projections) and takes the proxy perplexity 21.02 -> 20.34
# (docs/weight-only.md)
PROMOTE_ERROR: float | None = 0.005


@dataclass
class Quantized:
    """A layer's result: its codes, its AWQ input scales, its relative output error on the
    calibration data (None without data), the algorithm that ran and a note (a format the
    data chose)."""

    codes: BlockQuantized
    input_scale: np.ndarray | None
    error: float | None
    algorithm: str
    note: str = ""


def quantize_layers(
    model: onnx.ModelProto,
    layers: list[Layer],
    batches: list[Batch] | None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Quantized]:
    """Codes for every layer (by node name); numpy's BLAS runs one thread meanwhile
    (:mod:`onnxq.runtime.blas`: the same results for far less CPU)."""
    with blas_threads():
        return _quantize_layers(model, layers, batches, progress)


def _quantize_layers(
    model: onnx.ModelProto,
    layers: list[Layer],
    batches: list[Batch] | None,
    progress: Callable[[str], None] | None,
) -> dict[str, Quantized]:
    graph = ir.Graph(model)
    out: dict[str, Quantized] = {}
    readers: dict[str, int] = {}
    for x in layers:
        readers[x.weight] = readers.get(x.weight, 0) + 1
    data_free = [
        x for x in layers if batches is None or x.activation is None or readers[x.weight] > 1
    ]
    for layer in data_free:
        w = weight_matrix(graph, layer)
        out[layer.node] = Quantized(quantize_rtn(w, layer.fmt), None, None, "rtn")
    if batches is None:
        return out
    groups: dict[str, list[Layer]] = {}
    for layer in layers:
        if layer.node not in out:
            groups.setdefault(layer.activation or "", []).append(layer)
    runner = LayerwiseRunner(model, [[x] for x in groups], batches)
    for layer in data_free:  # quantized tables feed every later stage
        runner.set_weight(layer.weight, _stored(out[layer.node], layer))
    for i, (tensor, members) in enumerate(groups.items()):
        if progress is not None:
            progress(f"layer group {i + 1}/{len(groups)}: {', '.join(m.node for m in members)}")
        stats = InputStats(members[0].k)
        for values in runner.run():
            stats.update(values[tensor])
        for layer, result in _quantize_group(graph, members, stats).items():
            out[layer.node] = result
            if runner.reads_later(layer.weight):  # the LM head: no later stage reads it
                runner.set_weight(layer.weight, _stored(result, layer))
    return out


def _quantize_group(
    graph: ir.Graph, members: list[Layer], stats: InputStats
) -> dict[Layer, Quantized]:
    """Quantize the layers that read one input, by their algorithms."""
    hessian = stats.hessian
    weights = {m: weight_matrix(graph, m) for m in members}
    # AWQ's scales are searched for int4 layers: at 8 bits they buy nothing measurable, and an
    # LM head's search alone would cost minutes and its weight's size several times over
    awq = [m for m in members if m.algorithm in ("awq", "awq+gptq") and m.fmt.bits < 8]
    scale = None
    if awq:
        scale, alpha = search_scales([weights[m] for m in awq], hessian, stats.mean_abs, awq[0].fmt)
        if alpha == 0.0:  # plain rounding was best: no scales, no Mul
            scale = None
    out = {}
    factors: dict[bool, Factor] = {}  # one per Hessian (scaled by AWQ or not)
    for m in members:
        w = weights[m]
        s = scale if m in awq and scale is not None else None
        h = hessian if s is None else hessian / np.outer(s, s)
        result = _quantize_one(m, w, s, h, hessian, m.fmt, factors)
        if (
            PROMOTE_ERROR is not None
            and m.fmt.bits == 4
            and m.why == "default"
            and result.error is not None
            and result.error > PROMOTE_ERROR
        ):  # a layer int4 loses too much in: 8 bits (the measured default)
            wide = m.wide or BlockFormat(8, m.fmt.block_size, m.fmt.symmetric)
            promoted = _quantize_one(m, w, s, h, hessian, wide, factors)
            promoted.note = (
                f"int4 output error {result.error:.3g} > {PROMOTE_ERROR}: 8 bits (measured default)"
            )
            result = promoted
        out[m] = result
    return out


def _quantize_one(
    m: Layer,
    w: np.ndarray,
    s: np.ndarray | None,
    h: np.ndarray,
    hessian: np.ndarray,
    fmt: BlockFormat,
    factors: dict[bool, Factor],
) -> Quantized:
    """One layer in ``fmt`` by its algorithm; ``s``: AWQ input scales, ``h`` the Hessian of
    the (scaled) input, ``hessian`` the unscaled one (for the error)."""
    ws = w if s is None else w * s[:, None]
    if m.algorithm in ("gptq", "awq+gptq"):
        scaled = s is not None
        if scaled not in factors:
            factors[scaled] = Factor(h, GPTQ_DAMP, GPTQ_ACT_ORDER)
        codes = gptq(ws, factors[scaled], fmt)
    elif s is not None or m.algorithm == "awq":  # AWQ: clip search on the output error
        codes = quantize_rtn(ws, fmt, importance=np.diag(h))
    else:  # round to nearest: the data only measures the error
        codes = quantize_rtn(ws, fmt)
    deq = codes.dequantize()
    if s is not None:
        deq = deq / s[:, None]
    return Quantized(codes, s, output_error(w, deq, hessian), m.algorithm)


def _stored(result: Quantized, layer: Layer) -> np.ndarray:
    """The dequantized weight in the layout the model stores it in."""
    deq = result.codes.dequantize()
    if result.input_scale is not None:
        deq = deq / result.input_scale[:, None]
    return np.ascontiguousarray(deq.T) if layer.transposed else deq
