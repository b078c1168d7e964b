"""What ``onnxq analyze`` suggests for a quantized op, keyed from what it measured: which part of
the op's local error dominates (its weights, its activation inputs, a per-channel offset) says
which accuracy-recovery pass or exclusion should help.  :data:`ADVICE` is the decision table:
the first entry that applies to an op gives its suggestion.  The suggestions name the quantize
flags of the recovery passes (``--bias-correction``, ``--cle``, ``--adaround``,
``--smoothquant``, ``--shift-activations``) and of the selection (``--method-for``,
``--exclude``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from onnxq import ir
from onnxq.analyze.error_stats import ErrorSums, sqnr_to_db
from onnxq.analyze.layer_error import LayerError

OFFSET_SHARE = 0.3  # a per-channel offset this share of the error: bias correction removes it
DOMINATES_DB = 3.0  # one noise source dominates the other from this SQNR gap on
OUTLIER_RATIO = 20.0  # an input whose peak is this many times its RMS has outliers


@dataclass(frozen=True)
class Measured:
    """What the advice reads about one quantized op."""

    layer: LayerError
    local: ErrorSums  # the op output's local error
    inputs: list[ErrorSums]  # each activation input against its Q/DQ'd value


@dataclass(frozen=True)
class Advice:
    """One cause of a quantized op's local error: when it applies, and what to try."""

    name: str
    applies: Callable[[Measured], bool]
    text: Callable[[Measured], str]


def _weights_dominate(m: Measured) -> bool:
    w, i = m.layer.weight_sqnr_db, m.layer.input_sqnr_db
    return w is not None and (i is None or w < i - DOMINATES_DB)


def _inputs_dominate(m: Measured) -> bool:
    w, i = m.layer.weight_sqnr_db, m.layer.input_sqnr_db
    return i is not None and (w is None or i < w - DOMINATES_DB)


def _outlier_ratio(m: Measured) -> float:
    return max((s.peak / s.rms for s in m.inputs if s.rms > 0), default=0.0)


def _sources(m: Measured) -> str:
    """``weight SQNR 31.2 dB, input 40.1 dB``: the noise sources measured."""
    parts = [
        f"{what} SQNR {value:.1f} dB"
        for what, value in (("weight", m.layer.weight_sqnr_db), ("input", m.layer.input_sqnr_db))
        if value is not None
    ]
    return ", ".join(parts)


# in order: the first that applies to a quantized op is its advice
ADVICE: tuple[Advice, ...] = (
    Advice(
        "offset",
        lambda m: (m.layer.offset_share or 0.0) >= OFFSET_SHARE,
        lambda m: (
            f"a constant offset per channel is {m.layer.offset_share:.0%} of its local error: "
            "try --bias-correction"
        ),
    ),
    Advice(
        "conv weights",
        lambda m: _weights_dominate(m) and m.layer.op_type in ("Conv", "ConvTranspose"),
        lambda m: (
            f"its weights lose most ({_sources(m)}): try --cle (equalizes the per-channel weight "
            "ranges of conv chains, depthwise ones above all), then --adaround"
        ),
    ),
    Advice(
        "weights",
        _weights_dominate,
        lambda m: f"its weights lose most ({_sources(m)}): try --adaround",
    ),
    Advice(
        "input outliers",
        lambda m: (
            _inputs_dominate(m)
            and m.layer.op_type in ("MatMul", "Gemm")
            and _outlier_ratio(m) >= OUTLIER_RATIO
        ),
        lambda m: (
            f"its input has outliers (peak {_outlier_ratio(m):.0f}x its RMS; {_sources(m)}): "
            "try --smoothquant"
        ),
    ),
    Advice(
        "half grid",
        lambda m: (
            _inputs_dominate(m) and m.layer.input_half_grid and m.layer.op_type in ("Conv", "Gemm")
        ),
        lambda m: (
            f"its input loses most ({_sources(m)}) and is never negative, on a symmetric int8 "
            "grid whose negative half it never uses: try --shift-activations (with --adaround)"
        ),
    ),
    Advice(
        "input range",
        _inputs_dominate,
        lambda m: (
            f"its input's range loses most ({_sources(m)}): try --method-for "
            f"'{m.layer.producer}=mse'"
        ),
    ),
)


def advise(layer: LayerError, local: ErrorSums, inputs: list[ErrorSums]) -> str:
    """The suggestion for a quantized op; keeping it float (``--exclude``) always ends it."""
    m = Measured(layer, local, inputs)
    first = next((a for a in ADVICE if a.applies(m)), None)
    keep = f"--exclude '{layer.producer}' keeps it float"
    return f"{first.text(m)}; or {keep}" if first is not None else keep


def quantized_op(graph: ir.Graph, node: onnx.NodeProto) -> bool:
    """Whether ``node`` (of a Q/DQ model) reads a DequantizeLinear output: a quantized op."""
    if node.op_type in ir.QDQ_OPS:
        return False
    return any(
        (p := graph.producer.get(i)) is not None and p.op_type == "DequantizeLinear"
        for i in node.input
        if i
    )


def half_grid_input(graph: ir.Graph, node: onnx.NodeProto) -> bool:
    """Whether ``node`` reads an activation through QuantizeLinear -> DequantizeLinear with a
    signed zero point of 0 (a symmetric grid) whose input is never negative."""
    dq = graph.producer.get(node.input[0]) if node.input else None
    if dq is None or dq.op_type != "DequantizeLinear":
        return False
    q = graph.producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3:
        return False
    zero = graph.const_value(q.input[2])
    if zero is None or zero.dtype.kind != "i" or np.any(zero != 0):
        return False
    return graph.nonnegative(q.input[0])


def weight_sqnr_db(graph: ir.Graph, node: onnx.NodeProto) -> float | None:
    """The weight quantization SQNR of ``node``'s constant DequantizeLinear inputs (the
    lowest), from the stored integers and their scale: rounding leaves noise of scale^2/12
    per value, against the dequantized values' energy."""
    out = []
    for name in node.input:
        dq = graph.producer.get(name) if name else None
        if dq is None or dq.op_type != "DequantizeLinear" or not graph.is_const(dq.input[0]):
            continue
        q, scale = graph.const_value(dq.input[0]), graph.const_value(dq.input[1])
        attrs = ir.node_attrs(dq)
        if q is None or scale is None or attrs.get("block_size") or q.ndim == 0:
            continue
        if scale.size > 1:
            axis = int(attrs.get("axis", 1)) % q.ndim
            shape = [1] * q.ndim
            shape[axis] = scale.size
            scale = scale.reshape(shape)
        zp = graph.const_value(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        zero = 0 if zp is None else zp.reshape(scale.shape).astype(np.float64)
        values = (q.astype(np.float64) - zero) * scale.astype(np.float64)
        noise = float(np.broadcast_to(scale.astype(np.float64) ** 2 / 12, q.shape).sum())
        if (db := sqnr_to_db(float(np.vdot(values, values)), noise)) is not None:
            out.append(db)
    return min(out) if out else None
