"""Which Q/DQ groups onnxruntime's CPU optimizer turns into integer kernels.

onnxruntime fuses ``DQ -> op -> Q`` groups into QLinearConv, QLinearMatMul, QLinearAdd, ... when
the whole group is present with constant qparams.  This module optimizes a model the way a
session does, reads the optimized graph back and reports, per candidate op (a node whose
activation inputs all come out of DequantizeLinear nodes), whether it survived as a float op (not
fused) or was replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxq import ir
from onnxq.errors import UnsupportedModelError
from onnxq.ir.ops import WEIGHTED_OPS

# onnxruntime's integer kernels besides the QLinear* family
INTEGER_KERNELS = frozenset(
    {
        "QGemm",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QAttention",
    }
)


@dataclass(frozen=True)
class FusionReport:
    """Candidates (DQ -> op -> Q groups) and those onnxruntime left as float ops."""

    candidates: tuple[str, ...]
    unfused: tuple[tuple[str, str], ...]  # (node name, op type)
    integer_ops: dict[str, int]
    float_between: tuple[tuple[str, str], ...] = ()  # DQ -> op -> Q, op has no integer kernel
    # ops with an integer kernel that read a DequantizeLinear and write a quantized tensor but
    # also read a float activation (x * Sigmoid(x)): not Q/DQ groups, they run in float
    float_inputs: tuple[tuple[str, str], ...] = ()
    # why an unfused group may have stayed float, where the graph shows it (node -> reason)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def fused(self) -> int:
        """Number of candidate groups onnxruntime replaced with integer kernels."""
        return len(self.candidates) - len(self.unfused)

    @property
    def ratio(self) -> float:
        """Fused share of the candidates (1.0 when there are none)."""
        return self.fused / len(self.candidates) if self.candidates else 1.0


def fusion_report(
    model: onnx.ModelProto, kernel_ops: frozenset[str], folded: frozenset[str] = frozenset()
) -> FusionReport:
    """Optimize ``model`` with onnxruntime (extended level) and compare the graphs.

    Candidates are DQ -> op -> Q groups (or weighted ops), in the graph and inside its
    If/Loop/Scan bodies, whose op is in ``kernel_ops``; other
    ops wrapped the same way are listed apart: they run in float between quantized neighbours.
    An op whose only reader is a ``folded`` activation (the profile's
    ``folded_activations``: Relu, Clip) that feeds a Q counts as quantized at its output:
    onnxruntime folds the activation into the Q's range.
    """
    candidates: list[onnx.NodeProto] = []
    mixed: list[tuple[str, str]] = []
    float_between: list[tuple[str, str]] = []
    where: dict[str, ir.Graph] = {}
    for scope in ir.scopes(ir.Graph(model)):  # the groups inside control-flow bodies too
        found = _groups(scope, kernel_ops, folded)
        candidates += found[0]
        mixed += found[1]
        float_between += found[2]
        where.update((n.name, scope) for n in found[0])
    optimized = _optimized(model)
    # a candidate is unfused when, after optimization, a node of its name still reads a
    # DequantizeLinear output, whatever its op type became (Conv + Relu -> FusedConv is still
    # float); ops onnxruntime runs on int8 directly, like MaxPool, keep their name but lose the DQ
    nodes = list(ir.every_node(optimized.graph))
    opt_dq = {n.output[0] for n in nodes if n.op_type == "DequantizeLinear"}
    still_float = {n.name for n in nodes if any(i in opt_dq for i in n.input)}
    unfused = tuple((n.name, n.op_type) for n in candidates if n.name in still_float)
    reasons = {
        name: why
        for name, _ in unfused
        if (why := _shared_constant_dq(where[name], where[name].node_by_name(name)))
    }
    integer: dict[str, int] = {}
    for n in nodes:
        if n.op_type.startswith("QLinear") or n.op_type in INTEGER_KERNELS:
            integer[n.op_type] = integer.get(n.op_type, 0) + 1
    return FusionReport(
        tuple(n.name for n in candidates),
        unfused,
        dict(sorted(integer.items())),
        tuple(float_between),
        tuple(mixed),
        reasons,
    )


def _optimized(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as onnxruntime's extended-level optimizer leaves it (for the CPU)."""
    import onnxruntime as ort

    with ir.scratch_dir("onnxq-fusion-") as tmp:
        out = Path(tmp) / "optimized.onnx"
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # failures reach the user as onnxq errors
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(out)
        try:
            ort.InferenceSession(
                ir.session_bytes_or_path(model, Path(tmp)), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise UnsupportedModelError(f"onnxruntime cannot load the model: {exc}") from None
        return onnx.load(str(out))


def _groups(
    graph: ir.Graph, kernel_ops: frozenset[str], folded: frozenset[str]
) -> tuple[list[onnx.NodeProto], list[tuple[str, str]], list[tuple[str, str]]]:
    """The Q/DQ groups of one graph: the candidates (op with an integer kernel, every
    activation input out of a DQ), those that also read a float activation, and the ops
    without an integer kernel between quantized neighbours."""
    dq_outputs = {n.output[0] for n in graph.nodes if n.op_type == "DequantizeLinear"}
    q_inputs = {n.input[0] for n in graph.nodes if n.op_type == "QuantizeLinear"}
    # an activation onnxruntime folds into the Q after it: its input is quantized in effect
    q_inputs |= {
        n.input[0]
        for n in graph.nodes
        if n.op_type in folded
        and n.input
        and n.output[0] in q_inputs
        and len(graph.consumers.get(n.input[0], [])) == 1
    }

    def is_group(n: onnx.NodeProto) -> bool:
        # a DQ -> op -> Q group, or a weighted op whose data and weight come out of DQs
        # (onnxruntime has float-output integer kernels for those: QGemm, MatMulIntegerToFloat)
        fed = any(i in dq_outputs for i in n.input)
        weighted = (
            n.op_type in WEIGHTED_OPS
            and len(n.input) > 1
            and n.input[1] in dq_outputs
            and n.input[0] in dq_outputs
        )
        return fed and (weighted or any(o in q_inputs for o in n.output))

    def constant(name: str) -> bool:
        # an initializer, or an Identity copy of one (onnxruntime folds those first)
        while not graph.is_const(name):
            node = graph.producer.get(name)
            if node is None or node.op_type != "Identity" or not node.input:
                return False
            name = node.input[0]
        return True

    def float_input(n: onnx.NodeProto) -> bool:
        # onnxruntime fuses a group only when every activation input comes out of a DQ
        return any(i and i not in dq_outputs and not constant(i) for i in n.input)

    grouped = [n for n in graph.nodes if n.op_type not in ir.QDQ_OPS and is_group(n)]
    mixed = [(n.name, n.op_type) for n in grouped if n.op_type in kernel_ops and float_input(n)]
    candidates = [
        n for n in grouped if n.op_type in kernel_ops and (n.name, n.op_type) not in mixed
    ]
    float_between = [(n.name, n.op_type) for n in grouped if n.op_type not in kernel_ops]
    return candidates, mixed, float_between


def _shared_constant_dq(graph: ir.Graph, node: onnx.NodeProto | None) -> str:
    """A weight or bias DequantizeLinear that ``node`` shares with other nodes: onnxruntime
    fuses a group only when its constant DQs are its own (a bias DQ serves one scale)."""
    if node is None:
        return ""
    for index, name in enumerate(node.input):
        dq = graph.producer.get(name)
        if (
            index == 0
            or dq is None
            or dq.op_type != "DequantizeLinear"
            or not graph.is_const(dq.input[0])
        ):
            continue
        others = {n.name for n, _ in graph.consumers.get(name, []) if n.name != node.name}
        if others:
            return (
                f"its input {index} ({dq.name}) also feeds {len(others)} other node(s), "
                f"e.g. {sorted(others)[0]}; one quantized constant holds one scale (an "
                "int32 bias must be at each layer's input x weight scale): give each "
                "node its own copy"
            )
    return ""
