"""The half-range shift of a non-negative activation, as materialize writes it
(``shift_activations``; which tensors qualify: :mod:`onnxq.place.shift`).

A tensor with range ``[0, R]`` under symmetric int8 qparams of step ``s = R/127`` becomes
``Sub(x, c) -> QuantizeLinear -> DequantizeLinear`` with step ``s/2`` and ``c = 127 * s/2 =
R/2``: ``x = 0`` lands on ``-127`` and ``x = R`` on ``127``, so zeros stay exact and every
other value gets half the rounding error. Each reader adds ``c`` back through its bias,
``c * sum(W)`` per output channel with ``W`` the weights as they are quantized (with the float
weights the weights' rounding error times ``c`` would become a bias error on every output).
A reader that pads (a 3x3 depthwise Conv) gets a Pad of ``-c`` before the QuantizeLinear and
no padding of its own: ``-c`` is on the grid, so its border sees exactly the zeros it saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.numerics.qparams import QParams
from onnxq.place.shift import pads_of


def shift_qparams(qp: QParams, bits: int) -> tuple[QParams, float]:
    """The shifted tensor's qparams (half ``qp``'s step, the same range) and the shift
    ``c``, which the new step puts on the grid's lowest integer."""
    qmax = 2 ** (bits - 1) - 1
    scale = (np.asarray(qp.scale, dtype=np.float32) / np.float32(2)).astype(np.float32)
    shift = float(np.float32(qmax) * scale)
    note = f"quantized as x - {shift:.6g} (shift_activations): twice the steps over the range"
    return replace(qp, scale=scale, note=f"{qp.note}; {note}" if qp.note else note), shift


def shift_input(
    graph: ir.Graph, tensor: str, shift: float, readers: list[tuple[onnx.NodeProto, int]]
) -> str:
    """``Sub(tensor, shift)``, then a Pad of ``-shift`` where the one reader pads (its pads
    become 0); returns the tensor the QuantizeLinear reads."""
    value = graph.add_initializer(
        graph.unique_name(f"{tensor}_shift"), np.asarray(shift, dtype=np.float32)
    )
    shifted = graph.unique_name(f"{tensor}_shifted")
    graph.add_node("Sub", [tensor, value], [shifted], graph.unique_name(f"{tensor}_Shift"))
    pads = pads_of(readers[0][0]) if len(readers) == 1 else []
    if not pads:
        return shifted
    half = len(pads) // 2  # Conv pads: begins of the spatial axes, then their ends
    full = [0, 0, *pads[:half], 0, 0, *pads[half:]]
    pad_names = graph.add_initializer(
        graph.unique_name(f"{tensor}_shift_pads"), np.asarray(full, dtype=np.int64)
    )
    fill = graph.add_initializer(
        graph.unique_name(f"{tensor}_shift_fill"), np.asarray(-shift, dtype=np.float32)
    )
    padded = graph.unique_name(f"{tensor}_shifted_padded")
    graph.add_node(
        "Pad",
        [shifted, pad_names, fill],
        [padded],
        graph.unique_name(f"{tensor}_ShiftPad"),
        mode="constant",
    )
    graph.set_attr(readers[0][0], "pads", [0] * len(pads))
    return padded


def fold_shift(
    graph: ir.Graph,
    readers: list[onnx.NodeProto],
    shift: float,
    weight_of: Callable[[onnx.NodeProto], np.ndarray],
) -> None:
    """Add ``shift * sum(W)`` to each reader's bias (a new constant; a reader without one
    gets one), ``W`` = ``weight_of(reader)``, the weights as the model will compute with."""
    for node in readers:
        weight = weight_of(node).astype(np.float64)
        if node.op_type == "Conv":
            sums = weight.reshape(weight.shape[0], -1).sum(axis=1)
        else:  # Gemm: B is [K, N], or [N, K] with transB
            sums = weight.sum(axis=1 if ir.node_attrs(node).get("transB", 0) else 0)
        bias_name = node.input[2] if len(node.input) > 2 else ""
        bias = graph.const_value(bias_name) if bias_name else None
        base = np.zeros(sums.shape) if bias is None else bias.astype(np.float64)
        folded = (base + shift * sums).astype(np.float32)
        name = graph.add_initializer(graph.unique_name(f"{node.name}_bias_shifted"), folded)
        graph.set_input(node, 2, name)
