"""Write a precision plan (:mod:`onnxq.place.precision`) into a Q/DQ graph: a strongly typed
graph in which every float tensor has the type of the precision it is computed in.

What it writes, following TensorRT 11's strong typing (docs/backends.md) and the ONNX
operator schemas:

* a planned node's float tensors (those its schema ties to the type its float output has,
  ``T`` of Conv, Add, MatMul, ...) take the low type; inputs the schema types apart (Resize's
  ``scales``, an integer index) keep theirs;
* a Dequantize node takes the low type (its scale in the low type: its output has the
  scale's type, opset >= 19) when every reader of its output is low; a Quantize node when its
  input is low-typed: the integer tensor between them carries no float type, so a precision
  boundary at a Q/DQ pair needs no Cast;
* a constant a low node reads is stored in the low type (a copy when FP32 nodes read it too);
* a Cast goes only where a tensor meets a reader of the other precision (one per tensor and
  type); a Cast node of the model that makes a low node's input keeps its input and changes
  its target type, and a ConstantOfShape its value's;
* graph inputs and outputs, and the outer tensors a control-flow body reads, keep their
  names and FP32 type (``keep_io_types``; without it graph inputs and outputs take the low type
  where their nodes do).

:func:`write_precisions` returns what it wrote (:class:`TypingRecord`), for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxq import ir
from onnxq.errors import InternalError
from onnxq.place.precision import (
    PrecisionPlan,
    allows,
    fixed_float,
    float_constraints,
    tied_names,
)

FLOAT = onnx.TensorProto.FLOAT
SUFFIX: dict[int, str] = {
    onnx.TensorProto.FLOAT16: "fp16",
    onnx.TensorProto.BFLOAT16: "bf16",
    FLOAT: "fp32",
}


@dataclass
class TypingRecord:
    """What :func:`write_precisions` wrote: nodes by precision, the Casts it added, the
    constants it stored in the low type."""

    high: str
    low_nodes: list[str] = field(default_factory=list)
    fp32_nodes: list[str] = field(default_factory=list)
    casts: int = 0
    converted_constants: int = 0


# the low type of a plan without one (FP32): no tensor has it, so nothing is written low
NO_LOW = -1


def write_precisions(
    model: onnx.ModelProto,
    plan: PrecisionPlan,
    keep_io_types: bool = True,
    io_types: dict[str, int] | None = None,
) -> TypingRecord:
    """Type ``model`` (in place) by ``plan`` (see the module).  ``io_types``: the element type
    each graph input and output had before onnxq widened an FP16/BF16 model to FP32
    (:mod:`onnxq.prepare.upcast`), given back to them (with ``keep_io_types``)."""
    record = TypingRecord(plan.high)
    low = plan.low_type
    restore = dict(io_types or {}) if keep_io_types else {}
    if (low is None or not plan.low) and not restore:
        return record
    ir.infer_shapes(model)
    writer = _Writer(model, plan, low if low is not None else NO_LOW, keep_io_types, record)
    writer.restore = restore
    writer.run()
    return record


class _Writer:
    def __init__(
        self,
        model: onnx.ModelProto,
        plan: PrecisionPlan,
        low: int,
        keep_io: bool,
        record: TypingRecord,
    ) -> None:
        self.model, self.plan, self.low, self.keep_io = model, plan, low, keep_io
        self.record = record
        self.graph = ir.Graph(model)
        self.opset = ir.opset_version(model)
        # (tensor, type) -> the name that holds the tensor in that type
        self.held: dict[tuple[str, int], str] = {}
        self.types: dict[str, int] = {}
        self.restore: dict[str, int] = {}  # graph input/output -> the type it is given back
        kept = set(self.graph.subgraph_reads)
        if keep_io:
            kept |= set(self.graph.graph_outputs)
        self.kept_names = kept

    # -- which precision a node's float tensors take ------------------------------------
    def _mode(self, node: onnx.NodeProto) -> str:
        """``low``, ``fp32`` or ``follow`` (a node the plan does not decide: its float
        tensors keep the type its inputs have)."""
        if node.op_type == "DequantizeLinear":
            readers = self.graph.consumers.get(node.output[0], [])
            outs = node.output[0] in self.graph.graph_outputs
            takes = bool(readers) and all(self._takes_low(r, i) for r, i in readers)
            return "low" if takes and not outs else "fp32"
        if node.op_type == "QuantizeLinear":
            return "low" if self.types.get(node.input[0]) == self.low else "fp32"
        if node.name in self.plan.low:
            return "low"
        if node.name in self.plan.kept or node.domain not in ("", "ai.onnx"):
            return "fp32"
        return "follow"

    def _takes_low(self, node: onnx.NodeProto, index: int) -> bool:
        """Whether ``node`` reads its input ``index`` in the low type (a low node's tied input,
        or any input of a node that follows its inputs)."""
        if self.low == NO_LOW or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            return False
        if node.name in self.plan.low:
            constraints = float_constraints(node, self.graph, self.opset) or set()
            return node.input[index] in tied_names(node, self.opset, constraints)
        if node.name in self.plan.kept or node.domain not in ("", "ai.onnx"):
            return False
        return self._admits_low(node)

    def _admits_low(self, node: onnx.NodeProto, t: int | None = None) -> bool:
        """Whether ``node``'s schema takes type ``t`` (default: the low type) where it takes
        FLOAT (NonMaxSuppression's boxes are FLOAT only)."""
        constraints = float_constraints(node, self.graph, self.opset)
        want = self.low if t is None else t
        return constraints is not None and allows(node, self.opset, constraints, want)

    def _tied(self, node: onnx.NodeProto) -> set[str]:
        """The float tensors of ``node`` that share its precision."""
        if node.op_type == "DequantizeLinear":
            return {node.input[1], node.output[0]}
        if node.op_type == "QuantizeLinear":
            return {node.input[0], node.input[1]}
        constraints = float_constraints(node, self.graph, self.opset)
        if constraints is None:  # no schema (a custom domain): every float tensor stays FP32
            names = [*node.input, *node.output]
            return {n for n in names if n and self.graph.elem_type(n) == FLOAT}
        return set(tied_names(node, self.opset, constraints))

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> None:
        g = self.graph
        for name in g.graph_inputs:
            t = g.elem_type(name) or 0
            if name in self.restore:  # an FP16/BF16 model's input: its type again
                t = self.restore[name]
                _set_declared(self.model.graph.input, name, t)
            elif not self.keep_io and t == FLOAT and self._all_readers_low(name, quantize=True):
                _set_declared(self.model.graph.input, name, self.low)
                t = self.low
            self.types[name] = t
            self.held[(name, t)] = name
        for name in g.initializers:
            t = int(g.initializers[name].data_type)
            self.types[name] = t
            self.held[(name, t)] = name
        for node in list(g.nodes):  # topological: each input is typed before it is read
            self._node(node)
        self._outputs()
        g.commit()  # the Casts into topological order; FP32 constants no one reads dropped
        del self.model.graph.value_info[:]  # types changed: inference writes them again
        ir.infer_shapes(self.model)

    def _all_readers_low(self, name: str, quantize: bool = False) -> bool:
        """Whether every reader of ``name`` takes it in the low type (``quantize``: a
        QuantizeLinear counts, as it follows its input's type)."""
        readers = self.graph.consumers.get(name, [])
        return bool(readers) and all(
            self._takes_low(n, i) or (quantize and n.op_type == "QuantizeLinear")
            for n, i in readers
        )

    def _node(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Constant":
            self._constant(node)
            return
        mode = self._mode(node)
        tied = self._tied(node)
        floats = (FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        typed = [self.types[x] for x in node.input if x in tied and self.types.get(x) in floats]
        if mode == "low":
            want = self.low
        elif (
            mode == "follow" and typed and len(set(typed)) == 1 and self._admits_low(node, typed[0])
        ):
            want = typed[0]
        else:
            want = FLOAT
        fixed = set(fixed_float(node, self.opset))
        for i, name in enumerate(node.input):
            if name and name in fixed and self.types.get(name) in floats[1:]:
                node.input[i] = self._as(name, FLOAT)  # typed FLOAT alone by the schema
            elif name and name in tied and self.types.get(name) in floats:
                node.input[i] = self._as(name, want)
        for out in node.output:
            if out:
                self._written(node, out, self._output_type(node, out, want, tied))
        if want == self.low:
            self._retarget(node)
        if node.name in self.plan.low:
            self.record.low_nodes.append(node.name)
        elif node.name in self.plan.kept:
            self.record.fp32_nodes.append(node.name)

    def _output_type(self, node: onnx.NodeProto, out: str, want: int, tied: set[str]) -> int:
        original = self.graph.elem_type(out) or 0
        if out in tied and original == FLOAT:
            return want
        return original

    def _written(self, node: onnx.NodeProto, out: str, t: int) -> None:
        """Record that ``node`` writes ``out`` in type ``t``; a kept name (a graph output, an
        outer tensor a body reads) written low is renamed and cast back under its name."""
        original = self.restore.get(out) or self.graph.elem_type(out) or t
        if t != original and out in self.kept_names:
            renamed = self.graph.unique_name(f"{out}_{SUFFIX[t]}")
            for i, name in enumerate(node.output):
                if name == out:
                    node.output[i] = renamed
            self.types[renamed] = t
            self.held[(out, t)] = renamed
            self.held[(out, original)] = self._cast(renamed, out, original)
            self.types[out] = original
            return
        self.types[out] = t
        self.held[(out, t)] = out

    def _as(self, name: str, want: int) -> str:
        """The name of tensor ``name`` in type ``want``: itself, a low copy of a constant, or
        a Cast (one per tensor and type)."""
        have = self.types[name]
        key = (name, want)
        if key in self.held:
            return self.held[key]
        if have == want:
            return self.held.get((name, have), name)
        source = self.held.get((name, have), name)
        if name in self.graph.initializers:
            value = self.graph.const_value(name)  # also one left on disk (external data)
            if value is None:
                raise InternalError(f"the constant {name!r} has no value to convert")
            copy = self.graph.unique_name(f"{name}_{SUFFIX[want]}")
            lowered = value.astype(_np_type(want))
            self.graph.add_tensor(numpy_helper.from_array(lowered, copy))
            self.record.converted_constants += 1
            if have == FLOAT and self._is_scale(name):
                # the FP32 member of a Q/DQ pair whose other member scales in the low type
                # takes the same value: the pair quantizes and dequantizes by one scale
                self.graph.set_initializer(name, lowered.astype(np.float32))
            self.held[key] = copy
            self.types[copy] = want
            return copy
        target = self.graph.unique_name(f"{name}_{SUFFIX[want]}")
        self.held[key] = self._cast(source, target, want)
        self.types[target] = want
        return target

    def _is_scale(self, name: str) -> bool:
        """Whether ``name`` is the scale of a QuantizeLinear or DequantizeLinear."""
        return any(
            n.op_type in ("QuantizeLinear", "DequantizeLinear") and i == 1
            for n, i in self.graph.consumers.get(name, [])
        )

    def _cast(self, source: str, target: str, to: int) -> str:
        self.graph.add_node(
            "Cast", [source], [target], self.graph.unique_name(f"{target}_cast"), to=to
        )
        self.record.casts += 1
        return target

    def _constant(self, node: onnx.NodeProto) -> None:
        """A Constant node: stored in the low type when every reader is low."""
        out = node.output[0]
        value = self.graph.const_value(out)
        t = self.graph.elem_type(out) or 0
        if value is not None and t == FLOAT and self._all_readers_low(out):
            node.ClearField("attribute")
            lowered = numpy_helper.from_array(value.astype(_np_type(self.low)))
            node.attribute.append(helper.make_attribute("value", lowered))
            self.record.converted_constants += 1
            t = self.low
        self.types[out] = t
        self.held[(out, t)] = out

    def _retarget(self, node: onnx.NodeProto) -> None:
        """A low Cast casts to the low type; a low ConstantOfShape fills with it."""
        if node.op_type == "Cast" and _attr_int(node, "to", 0) == FLOAT:
            self.graph.set_attr(node, "to", self.low)
        if node.op_type == "ConstantOfShape":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
            if fill.dtype == np.float32:
                self.graph.set_attr(
                    node, "value", numpy_helper.from_array(fill.astype(_np_type(self.low)))
                )

    def _outputs(self) -> None:
        """Graph outputs: kept FP32 under their names (``_written`` cast them back), or, when
        I/O types may change, declared in the type their producer writes."""
        for out in self.model.graph.output:
            t = self.types.get(out.name)
            if t is not None and out.type.tensor_type.elem_type != t:
                out.type.tensor_type.elem_type = t


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _set_declared(values: list[onnx.ValueInfoProto], name: str, t: int) -> None:
    for vi in values:
        if vi.name == name:
            vi.type.tensor_type.elem_type = t


def _np_type(t: int) -> np.dtype:
    if t == onnx.TensorProto.BFLOAT16:
        import ml_dtypes  # onnx's own dependency: numpy has no bfloat16

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


__all__ = ["TypingRecord", "write_precisions"]
