"""The report's precision split: how much of the written graph computes in each precision, and
why each node the plan kept in FP32 is FP32 (:class:`PrecisionSplit`, a report section).

A weighted layer (Conv, ConvTranspose, Gemm, MatMul) whose activation or weight comes through
a DequantizeLinear counts in the quantized type (``int8``, ``fp8``, ``int4``); every other
float compute node counts in the type it writes (``fp16``, ``bf16``, ``fp32``).  Multiply-adds
are those of the weighted layers, per sample, from the inferred shapes
(:func:`onnxq.place.macs.layer_macs`; a layer with dynamic shapes counts as a node only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import onnx

from onnxq import ir
from onnxq.ir.ops import WEIGHTED_OPS
from onnxq.materialize.typing import TypingRecord
from onnxq.place.macs import layer_macs
from onnxq.place.precision import PrecisionPlan

NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "fp32",
    onnx.TensorProto.FLOAT16: "fp16",
    onnx.TensorProto.BFLOAT16: "bf16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.UINT16: "int16",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "int4",
    onnx.TensorProto.FLOAT8E4M3FN: "fp8",
}
# nodes that move or type tensors rather than compute: not counted
NOT_COMPUTE = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Constant"})


@dataclass(frozen=True)
class PrecisionSplit:
    """The precision split of a written graph (see the module)."""

    high: str
    macs: tuple[tuple[str, int], ...]  # precision -> multiply-adds per sample
    nodes: tuple[tuple[str, int], ...]  # precision -> float compute nodes
    kept: tuple[tuple[str, str], ...]  # (node, why it is FP32) for the plan's FP32 nodes
    casts: int

    @classmethod
    def of(
        cls, model: onnx.ModelProto, plan: PrecisionPlan, record: TypingRecord
    ) -> PrecisionSplit:
        """The split of ``model`` as written by ``plan`` (``record``: what the writer did)."""
        graph = ir.Graph(ir.infer_shapes(model) if not model.graph.value_info else model)
        macs: Counter[str] = Counter()
        nodes: Counter[str] = Counter()
        for node in graph.nodes:
            if node.op_type in NOT_COMPUTE or not node.output:
                continue
            precision = _precision(graph, node)
            if precision is None:
                continue
            nodes[precision] += 1
            if node.op_type in WEIGHTED_OPS:
                macs[precision] += layer_macs(graph, node) or 0
        kept = tuple(sorted(plan.kept.items()))
        return cls(
            plan.high, tuple(sorted(macs.items())), tuple(sorted(nodes.items())), kept, record.casts
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"precision": {...}}``: the high precision, multiply-adds and nodes by precision,
        the FP32 nodes with their reasons, the Casts written."""
        return {
            "precision": {
                "high_precision": self.high,
                "macs": dict(self.macs),
                "nodes": dict(self.nodes),
                "fp32": [{"node": n, "reason": r} for n, r in self.kept],
                "casts": self.casts,
            }
        }

    def summary_lines(self) -> list[str]:
        """The split in one line, then one per reason the plan kept nodes in FP32."""
        total = sum(m for _, m in self.macs)
        shares = (
            ", ".join(f"{100 * m / total:.1f}% {p}" for p, m in self.macs if m) if total else ""
        )
        counts = ", ".join(f"{n} {p}" for p, n in self.nodes)
        head = f"precision: float compute in {self.high}"
        lines = [
            head
            + (f"; multiply-adds {shares}" if shares else "")
            + (f"; ops {counts}" if counts else "")
            + (f"; {self.casts} Cast(s) at precision boundaries" if self.casts else "")
        ]
        by_reason: Counter[str] = Counter(_kind(r) for _, r in self.kept)
        for kind, n in by_reason.most_common():
            first = next(node for node, r in self.kept if _kind(r) == kind)
            why = dict(self.kept)[first]
            lines.append(f"  fp32: {n} op(s), e.g. {first!r}: {why}")
        return lines


def _kind(reason: str) -> str:
    """A reason without its names and numbers: what groups FP32 nodes in the summary."""
    return reason.split(" ", 2)[0] if reason.startswith("activation") else reason.split(":")[0]


def _precision(graph: ir.Graph, node: onnx.NodeProto) -> str | None:
    """The precision ``node`` computes in (None: it writes no float tensor)."""
    if node.op_type in WEIGHTED_OPS:
        for name in node.input[:2]:
            dq = graph.producer.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                kind = NAMES.get(graph.elem_type(dq.input[0]) or 0)
                if kind is not None:
                    return kind
    t = graph.elem_type(node.output[0])
    if t in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        return NAMES[t]
    return None


__all__ = ["PrecisionSplit"]
