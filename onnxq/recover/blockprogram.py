"""One block of a Q/DQ model as a small program that runs forward and back by hand.

:func:`block_program` cuts a :class:`onnxq.recover.blocks.Block` out of the model with Q/DQ
placed (what the run will write: the activation ranges, the integers of the layers already
learned): its Convs, Relus, Clips and Adds, and every QuantizeLinear -> DequantizeLinear pair
on an activation between them, which becomes a fake quantizer with the pair's scale and zero
point.  The weights of the layers being learned are AdaRound's soft weights
``s * clip(floor(W / s) + h(v), -qmax, qmax)`` (:mod:`onnxq.recover.rounding`); every other
weight is the constant the Q/DQ model computes.  :meth:`BlockProgram.forward` computes the
block's output for a batch of its input and :meth:`BlockProgram.backward` the gradient of a
loss on it with respect to each soft weight; a fake quantizer passes the gradient where its
input lies inside its range (the straight-through estimator), a Clip or Relu where it passes
its input.  The convolutions run on an engine (:mod:`onnxq.recover.convengine`): numpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.recover.convengine import ConvGeometry, NumpyConv

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass
class Step:
    """One op of a block program: ``kind`` is conv, relu, clip, add, quant or identity."""

    kind: str
    inputs: list[str]
    output: str
    weight: str | None = None  # conv: the learned weight's float name, or None (constant)
    const: np.ndarray | None = None  # conv: the constant weight
    bias: np.ndarray | None = None
    geometry: ConvGeometry | None = None
    bounds: tuple[float, float] = (-np.inf, np.inf)  # clip, relu; quant: integer range
    scale: float = 1.0  # quant
    zero_point: float = 0.0


@dataclass
class BlockProgram:
    """The steps of a block in order, the tensor it reads and the one it gives."""

    input: str
    output: str
    steps: list[Step]
    learned: dict[str, str] = field(default_factory=dict)  # learned weight -> conv node

    def forward(self, engine: NumpyConv, x: Any, weights: dict[str, Any]) -> tuple[Any, dict]:
        """The block's output for ``x`` with the learned ``weights`` (engine arrays, the
        Convs' shape), and what :meth:`backward` needs."""
        xp = engine.xp
        values: dict[str, Any] = {self.input: x}
        for step in self.steps:
            a = values[step.inputs[0]]
            if step.kind == "conv":
                assert step.geometry is not None
                w = weights[step.weight] if step.weight else engine.array(_const(step))
                padded = engine.pad(a, step.geometry)
                y = engine.forward(padded, w, step.geometry)
                if step.bias is not None:
                    y = y + engine.array(step.bias.reshape(1, -1, 1, 1))
                values[step.output + "#padded"] = padded
            elif step.kind in ("clip", "relu"):
                y = xp.clip(a, step.bounds[0], step.bounds[1])
                values[step.output + "#passed"] = (a >= step.bounds[0]) & (a <= step.bounds[1])
            elif step.kind == "quant":
                q = xp.round(a / step.scale) + step.zero_point
                y = (xp.clip(q, step.bounds[0], step.bounds[1]) - step.zero_point) * step.scale
                values[step.output + "#passed"] = (q >= step.bounds[0]) & (q <= step.bounds[1])
            elif step.kind == "add":
                y = a + values[step.inputs[1]]
            else:
                y = a
            values[step.output] = y
        return values[self.output], values

    def backward(
        self, engine: NumpyConv, grad: Any, values: dict, weights: dict[str, Any]
    ) -> dict[str, Any]:
        """The gradient with respect to each learned weight of a loss whose gradient at the
        block's output is ``grad``."""
        grads: dict[str, Any] = {self.output: grad}
        out: dict[str, Any] = {}
        first = self.steps[0].output if self.steps else None
        for step in reversed(self.steps):
            g = grads.pop(step.output, None)
            if g is None:
                continue
            if step.kind == "conv":
                assert step.geometry is not None
                w = weights[step.weight] if step.weight else engine.array(_const(step))
                need_x = step.output != first and step.inputs[0] != self.input
                dx, dw = engine.backward(
                    values[step.output + "#padded"], w, g, step.geometry, need_x
                )
                if step.weight:
                    out[step.weight] = dw
                if dx is not None:
                    _accumulate(grads, step.inputs[0], engine.crop(dx, step.geometry))
            elif step.kind in ("clip", "relu", "quant"):  # where the input passes through
                _accumulate(grads, step.inputs[0], g * values[step.output + "#passed"])
            elif step.kind == "add":
                _accumulate(grads, step.inputs[0], g)
                _accumulate(grads, step.inputs[1], g)
            else:
                _accumulate(grads, step.inputs[0], g)
        return out


def _const(step: Step) -> np.ndarray:
    assert step.const is not None
    return step.const


def _accumulate(grads: dict[str, Any], name: str, value: Any) -> None:
    grads[name] = value if name not in grads else grads[name] + value


def block_program(
    quantized: onnx.ModelProto, block_input: str, block_output: str, learned: dict[str, str]
) -> BlockProgram | str:
    """The program of the block between ``block_input`` and ``block_output`` of ``quantized``
    (the model with Q/DQ; ``learned``: Conv node name -> the float weight learned there), or
    why it cannot be built."""
    graph = ir.Graph(quantized)
    producer = {o: n for n in graph.nodes for o in n.output}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    picked: dict[str, onnx.NodeProto] = {}
    stack = [block_output]
    while stack:
        tensor = stack.pop()
        if tensor == block_input or graph.is_const(tensor):
            continue
        node = producer.get(tensor)
        if node is None:
            return f"reads {tensor!r}, not computed from the block's input"
        if node.name in picked:
            continue
        picked[node.name] = node
        stack.extend(i for i in node.input if i)
    nodes = sorted(picked.values(), key=lambda n: order[n.name])
    steps: list[Step] = []
    for node in nodes:
        step = _step(graph, node, picked, learned)
        if isinstance(step, str):
            return step
        if step is not None:
            steps.append(step)
    return BlockProgram(block_input, block_output, steps, {w: n for n, w in learned.items()})


def _step(
    graph: ir.Graph, node: onnx.NodeProto, picked: dict, learned: dict[str, str]
) -> Step | str | None:
    """The step of ``node`` (None: a DequantizeLinear its QuantizeLinear's step covers, or a
    constant weight's), or why it is not supported."""
    op, inputs, output = node.op_type, [i for i in node.input if i], node.output[0]
    if op == "Conv":
        return _conv_step(graph, node, learned)
    if op == "Relu":
        return Step("relu", inputs[:1], output, bounds=(0.0, np.inf))
    if op == "Clip":
        low, high = graph.clip_bounds(node)
        bounds = (-np.inf if low is None else low, np.inf if high is None else high)
        return Step("clip", inputs[:1], output, bounds=bounds)
    if op in ("Add", "Identity"):
        if any(graph.is_const(i) for i in inputs):
            return f"{op} {node.name!r} reads a constant"
        return Step(op.lower(), inputs, output)
    if op == "DequantizeLinear" and graph.is_const(inputs[0]):
        return None  # a weight: the Conv reads its value
    if op == "DequantizeLinear":  # its QuantizeLinear's step gives the first reader's output
        first = _dq_readers(node.input[0], picked)[0]
        return None if first is node else Step("identity", [first.output[0]], output)
    if op == "QuantizeLinear":
        return _quant_step(graph, node, picked)
    return f"has a {op} node ({node.name!r})"


def _quant_step(graph: ir.Graph, node: onnx.NodeProto, picked: dict) -> Step | str:
    """A fake quantizer for a per-tensor QuantizeLinear read by DequantizeLinears with the same
    scale and zero point."""
    readers = _dq_readers(node.output[0], picked)
    scale = graph.const_value(node.input[1])
    zp = graph.const_value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if not readers or scale is None:
        return f"QuantizeLinear {node.name!r} is not read by a DequantizeLinear"
    for reader in readers:
        if list(reader.input[1:]) != list(node.input[1:]):
            return f"DequantizeLinear {reader.name!r} does not share its QuantizeLinear's scale"
    if scale.size != 1 or (zp is not None and zp.size != 1):
        return f"QuantizeLinear {node.name!r} is per channel"
    dtype = np.dtype(zp.dtype) if zp is not None else np.dtype(np.uint8)
    if dtype.kind not in "iu" or dtype.itemsize > 2:
        return f"QuantizeLinear {node.name!r} quantizes to {dtype}"
    info = np.iinfo(dtype)
    return Step(
        "quant",
        [node.input[0]],
        readers[0].output[0],
        bounds=(float(info.min), float(info.max)),
        scale=float(scale.reshape(-1)[0]),
        zero_point=float(0 if zp is None else zp.reshape(-1)[0]),
    )


def _dq_readers(tensor: str, picked: dict) -> list[onnx.NodeProto]:
    """The picked nodes reading ``tensor`` (a QuantizeLinear's output), all DequantizeLinear
    (else an empty list)."""
    readers = [n for n in picked.values() if tensor in n.input]
    return readers if all(n.op_type == "DequantizeLinear" for n in readers) else []


def _conv_step(graph: ir.Graph, node: onnx.NodeProto, learned: dict[str, str]) -> Step | str:
    attrs = ir.node_attrs(node)
    weight_name = node.input[1]
    weight = _weight_value(graph, weight_name)
    if weight is None or weight.ndim != 4:
        return f"Conv {node.name!r} is not a 2-D Conv with a constant weight"
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
        return f"Conv {node.name!r} has auto_pad"
    bias = graph.const_value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    pads = tuple(int(p) for p in attrs.get("pads", [0, 0, 0, 0]))
    geometry = ConvGeometry(
        tuple(int(s) for s in attrs.get("strides", [1, 1])),  # type: ignore[arg-type]
        tuple(int(d) for d in attrs.get("dilations", [1, 1])),  # type: ignore[arg-type]
        (pads[0], pads[1], pads[2], pads[3]),
        int(attrs.get("group", 1)),
    )
    return Step(
        "conv",
        [node.input[0]],
        node.output[0],
        weight=learned.get(node.name),
        const=weight.astype(np.float32),
        bias=None if bias is None else bias.astype(np.float32),
        geometry=geometry,
    )


def _weight_value(graph: ir.Graph, name: str) -> np.ndarray | None:
    """A Conv weight's float value: a constant, or the DequantizeLinear of constants."""
    value = graph.const_value(name)
    if value is not None:
        return value.astype(np.float32)
    node = next((n for n in graph.nodes if name in n.output), None)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    parts = [graph.const_value(i) if i else None for i in node.input]
    if parts[0] is None or parts[1] is None:
        return None
    axis = int(ir.node_attrs(node).get("axis", 1))
    shape = [1] * parts[0].ndim
    scale = parts[1].astype(np.float32)
    zp = parts[2] if len(parts) > 2 and parts[2] is not None else np.zeros_like(parts[1])
    if scale.size > 1:
        shape[axis] = -1
    values = parts[0].astype(np.float32) - zp.astype(np.float32).reshape(shape)
    return values * scale.reshape(shape)


__all__ = ["BlockProgram", "Step", "block_program"]
