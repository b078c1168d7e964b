"""Dynamic quantization: the only place that writes onnxruntime's dynamically quantized kernels.

Called by :func:`onnxq.materialize.materialize` for a dynamic profile.  Each op a dynamic rule
claimed (``onnxq.rewrites.dynamic``) is replaced by its kernel in onnxruntime's ``com.microsoft``
domain, under the same output names, in the graph it sits in (an If/Loop/Scan body's too):

* MatMul / Gemm -> ``DynamicQuantizeMatMul(A, B_int8[K, N], b_scale[N], b_zero_point[N], bias)``:
  the weight quantized per output column ahead of time (a Gemm's ``alpha`` folded into the
  scales, ``beta * C`` into the bias, a MatMul's bias Add that the rule fused taken in as the
  bias), ``A`` quantized per tensor to uint8 by the kernel at run time; an ``A`` that several
  of them read (attention's q, k and v projections) is quantized once by a
  ``DynamicQuantizeLinear`` and read by ``MatMulIntegerToFloat`` kernels;
* LSTM -> ``DynamicQuantizeLSTM``: W and R quantized per gate row and direction and stored
  transposed (``[dirs, n, 4*hidden]``), as the kernel reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.errors import InternalError
from onnxq.metadata import Placed, write_metadata
from onnxq.observers import QParams, quantize_weight, weight_qparams
from onnxq.options import WeightOptions
from onnxq.place.annotations import Annotations
from onnxq.precisions import CONTRIB_DOMAIN
from onnxq.rewrites.dynamic import bias_add

# what the kernels quantize activations to at run time: per tensor, uint8, from the tensor's
# own min/max on each call
RUNTIME_METHOD = "dynamic: per tensor, uint8, min/max of each run"


def materialize_dynamic(
    model: onnx.ModelProto,
    annotations: Annotations,
    profile: BackendProfile,
    options: WeightOptions,
) -> list[Placed]:
    """Replace every op a dynamic rule claimed by its kernel (``model`` edited in place), in
    the graph the op sits in: the top level or an If/Loop/Scan body."""
    graph = ir.Graph(model)
    scopes = ir.scopes(graph)
    where = {n.name: (scope, n) for scope in scopes for n in scope.nodes}
    folded = {d.node for d in annotations.decisions if d.quantized and d.rule == "fused"}
    claimed = [d for d in annotations.decisions if d.quantized and d.rule in WRITERS]
    # an activation several MatMuls of one graph read (attention's q, k and v) is quantized once
    readers = Counter(_input_key(*where[d.node]) for d in claimed if d.rule in SHARING_RULES)
    shared: dict[tuple[int, str], tuple[str, str, str]] = {}
    placed: list[Placed] = []
    replaced: dict[int, tuple[ir.Graph, list[onnx.NodeProto]]] = {}
    for decision in claimed:
        scope, node = where[decision.node]
        add = bias_add(scope, node) if node.op_type == "MatMul" else None
        add = add if add is not None and add.name in folded else None
        key, once = _input_key(scope, node), None
        if decision.rule in SHARING_RULES and readers[key] > 1:
            if key not in shared:
                shared[key] = _quantize_once(scope, node.input[0])
            once = shared[key]
        writer = WRITERS[decision.rule]
        placed += writer(scope, node, profile.weight_qmax, options.weight_method, add, once)
        done = replaced.setdefault(id(scope), (scope, []))[1]
        done += [node] if add is None else [node, add]
    for scope, nodes in replaced.values():
        scope.remove_nodes(nodes)
    if placed:
        ir.set_domain_opset(model, CONTRIB_DOMAIN, 1)
    for scope in reversed(scopes):  # bodies inside out, the top-level graph last
        scope.commit()
    placed = _merged(placed)
    write_metadata(model, placed, profile.target_cpu)
    return placed


def _input_key(scope: ir.Graph, node: onnx.NodeProto) -> tuple[int, str]:
    """The graph a kernel sits in and the activation it quantizes."""
    return id(scope), node.input[0]


def _quantize_once(graph: ir.Graph, tensor: str) -> tuple[str, str, str]:
    """DynamicQuantizeLinear of ``tensor``: its uint8 values, scale and zero point."""
    outs = [graph.unique_name(f"{tensor}_{part}") for part in ("quantized", "scale", "zero_point")]
    graph.add_node(
        "DynamicQuantizeLinear", [tensor], outs, graph.unique_name(f"{tensor}_DynamicQuantize")
    )
    return outs[0], outs[1], outs[2]


def _merged(placed: list[Placed]) -> list[Placed]:
    """One entry per tensor: an activation several kernels quantize lists all its readers."""
    out: dict[tuple[str, str], Placed] = {}
    for p in placed:
        have = out.get((p.tensor, p.kind))
        if have is None:
            out[(p.tensor, p.kind)] = p
        else:
            out[(p.tensor, p.kind)] = replace(have, consumers=have.consumers + p.consumers)
    return list(out.values())


def _runtime_activation(tensor: str, node: onnx.NodeProto) -> Placed:
    qp = QParams(
        np.asarray(np.nan, np.float32),
        np.asarray(0, np.uint8),
        None,
        RUNTIME_METHOD,
        np.nan,
        np.nan,
    )
    return Placed(tensor, "activation", qp, ((node.name, 0),), 8, "uint8", runtime=True)


def _const(graph: ir.Graph, name: str) -> np.ndarray:
    value = graph.const_value(name)
    if value is None:
        raise InternalError(f"weight {name!r} lost its constant value")
    return value


def _matmul(
    graph: ir.Graph,
    node: onnx.NodeProto,
    qmax: int,
    method: str,
    add: onnx.NodeProto | None = None,
    once: tuple[str, str, str] | None = None,
) -> list[Placed]:
    """MatMul or Gemm (and the bias ``add`` after a MatMul) -> DynamicQuantizeMatMul, or
    MatMulIntegerToFloat when the input was quantized ``once`` for several readers."""
    weight_name = node.input[1]
    w, bias, output = _weight_and_bias(graph, node, add)
    qp = weight_qparams(w, 1, qmax, method)
    stored = graph.add_initializer(
        graph.unique_name(f"{weight_name}_quantized"), quantize_weight(w, qp, qmax)
    )
    scale = graph.add_initializer(graph.unique_name(f"{weight_name}_scale"), qp.scale)
    zero = graph.add_initializer(graph.unique_name(f"{weight_name}_zero_point"), qp.zero_point)
    bias_name = (
        graph.add_initializer(
            graph.unique_name(f"{node.name}_bias"), np.ascontiguousarray(bias, np.float32)
        )
        if bias is not None
        else ""
    )
    if once is None:
        op, inputs = "DynamicQuantizeMatMul", [node.input[0], stored, scale, zero, bias_name]
    else:
        x_q, x_scale, x_zero = once
        op, inputs = "MatMulIntegerToFloat", [x_q, stored, x_scale, scale, x_zero, zero, bias_name]
    graph.add_node(
        op,
        inputs if bias_name else inputs[:-1],
        [output],
        graph.unique_name(f"{node.name}_dynamic"),
        domain=CONTRIB_DOMAIN,
    )
    return [
        _runtime_activation(node.input[0], node),
        Placed(weight_name, "weight", qp, ((node.name, 1),), _bits(qmax), "int8"),
    ]


def _weight_and_bias(
    graph: ir.Graph, node: onnx.NodeProto, add: onnx.NodeProto | None
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """The [K, N] weight the kernel multiplies by (a Gemm's transB and alpha applied), the
    bias it adds (a MatMul's bias ``add``, a Gemm's ``beta * C``) and the tensor it writes."""
    w = _const(graph, node.input[1]).astype(np.float32)
    bias = None
    output = node.output[0]
    if add is not None:  # the Linear layer's bias: the kernel adds it
        other = add.input[1] if add.input[0] == output else add.input[0]
        bias, output = _const(graph, other).astype(np.float32).reshape(-1), add.output[0]
    if node.op_type == "Gemm":
        attrs = ir.node_attrs(node)
        if int(attrs.get("transB", 0)):
            w = w.T
        w = w * np.float32(attrs.get("alpha", 1.0))  # alpha folded into the weight's scales
        if len(node.input) > 2 and node.input[2]:
            c = _const(graph, node.input[2]).astype(np.float32)
            beta = np.float32(attrs.get("beta", 1.0))
            bias = np.broadcast_to(c.reshape(-1), (w.shape[1],)) * beta
    return w, bias, output


def _lstm(
    graph: ir.Graph,
    node: onnx.NodeProto,
    qmax: int,
    method: str,
    add: onnx.NodeProto | None = None,
    once: tuple[str, str, str] | None = None,
) -> list[Placed]:
    """LSTM -> DynamicQuantizeLSTM (W, R per direction and gate row, stored transposed); it
    quantizes its own input (``add`` and ``once`` are None)."""
    quantized: list[str] = []
    placed = [_runtime_activation(node.input[0], node)]
    for index in (1, 2):
        name = node.input[index]
        value = _const(graph, name).astype(np.float32)  # [dirs, 4*hidden, n]
        dirs, rows, cols = value.shape
        flat = value.reshape(dirs * rows, cols)
        qp = weight_qparams(flat, 0, qmax, method)
        q = quantize_weight(flat, qp, qmax).reshape(dirs, rows, cols).transpose(0, 2, 1)
        scale = qp.scale.reshape(dirs, rows)
        quantized += [
            graph.add_initializer(graph.unique_name(f"{name}_quantized"), q),
            graph.add_initializer(graph.unique_name(f"{name}_scale"), scale),
            graph.add_initializer(
                graph.unique_name(f"{name}_zero_point"), np.zeros((dirs, rows), np.int8)
            ),
        ]
        shown = QParams(scale, np.zeros((dirs, rows), np.int8), 1, qp.method, qp.low, qp.high)
        placed.append(Placed(name, "weight", shown, ((node.name, index),), _bits(qmax), "int8"))
    optional = [node.input[i] if i < len(node.input) else "" for i in range(3, 8)]
    w_q, w_scale, w_zero, r_q, r_scale, r_zero = quantized
    attrs = {k: v for k, v in ir.node_attrs(node).items() if k != "layout"}
    graph.add_node(
        "DynamicQuantizeLSTM",
        [node.input[0], w_q, r_q, *optional, w_scale, w_zero, r_scale, r_zero],
        list(node.output),
        graph.unique_name(f"{node.name}_dynamic"),
        domain=CONTRIB_DOMAIN,
        **attrs,
    )
    return placed


def _bits(qmax: int) -> int:
    """The bits an integer weight of magnitude up to ``qmax`` uses (127: 8, 63: 7)."""
    return int(qmax).bit_length() + 1


Writer = Callable[
    [ir.Graph, onnx.NodeProto, int, str, onnx.NodeProto | None, tuple[str, str, str] | None],
    list[Placed],
]
SHARING_RULES = frozenset({"dynamic_matmul", "dynamic_gemm"})
WRITERS: dict[str, Writer] = {
    "dynamic_matmul": _matmul,
    "dynamic_gemm": _matmul,
    "dynamic_lstm": _lstm,
}
