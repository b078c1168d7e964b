"""Dynamic quantization: the only place that writes onnxruntime's dynamically quantized kernels.

Called by :func:`onnxq.materialize.qdq.materialize` for a dynamic profile.  Each op a dynamic rule
claimed (``onnxq.place.rules.dynamic``) is replaced by its kernel in onnxruntime's ``com.microsoft``
domain, under the same output names, in the graph it sits in (an If/Loop/Scan body's too):

* MatMul / Gemm -> ``DynamicQuantizeMatMul(A, B_int8[K, N], b_scale, , bias)``: the weight
  quantized ahead of time, per output column (``b_scale[N]``) or with one scale where placement
  gave it one (``onnxq.place.rules.dynamic.ONE_SCALE_SQNR_DB``; a Gemm's ``alpha`` folded into the
  scales, ``beta * C`` into the bias, a MatMul's bias Add that the rule fused taken in as the
  bias), ``A`` quantized per tensor to uint8 by the kernel at run time; an ``A`` that several of
  them read (attention's q, k and v projections) is quantized once by a
  ``DynamicQuantizeLinear`` and read by ``MatMulIntegerToFloat`` kernels;
* a MatMul reading a gated product (SwiGLU's down projection) -> the same kernel on the product
  with its outlier channels zeroed, plus a float MatMul of those channels' rows
  (``onnxq.place.rules.gated``);
* LSTM -> ``DynamicQuantizeLSTM``: W and R quantized per gate row and direction and stored
  transposed (``[dirs, n, 4*hidden]``), as the kernel reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.options import WeightOptions
from onnxq.errors import InternalError
from onnxq.materialize.metadata import Placed, write_metadata
from onnxq.numerics.precisions import CONTRIB_DOMAIN
from onnxq.numerics.qparams import QParams, quantize_weight, weight_qparams
from onnxq.place.annotations import Annotations
from onnxq.place.rules.dynamic import GATED_OUTLIERS, bias_add
from onnxq.place.rules.gated import linear_factor, outlier_channels
from onnxq.place.rules.residual_sum import residual_sums

# what a gated product's outlier channels are divided by on their way into the quantized
# kernel (and their weight rows multiplied by in the float MatMul beside it): a power of two,
# so both are exact; 2900 (smollm2_135m's largest) comes out 2.8, inside a typical token's range
OUTLIER_SHRINK = 1024.0

# what the kernels quantize activations to at run time: per tensor, uint8, from the tensor's
# own min/max on each call
RUNTIME_METHOD = "dynamic: per tensor, uint8, min/max of each run"


@dataclass(frozen=True)
class Kernel:
    """How a kernel's weight is quantized: integers within ``+-qmax``, the weight range
    ``method``, one scale per output column (``per_column``) or one for the whole weight
    (an LSTM's weights always take one per gate row); for a MatMul reading a gated product,
    whether its up projection's weight columns may be divided (their own scales keep them)."""

    qmax: int
    method: str
    per_column: bool
    up_columns_divisible: bool = False  # a gated product's up projection keeps per-column scales


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
    claimed.sort(key=lambda d: d.rule not in WRITTEN_FIRST)  # stable: graph order otherwise
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
        kernel = _kernel(scope, node, annotations, profile, options)
        placed += WRITERS[decision.rule](scope, node, kernel, add, once)
        done = replaced.setdefault(id(scope), (scope, []))[1]
        done += [node] if add is None else [node, add]
    for scope, nodes in replaced.values():
        scope.remove_nodes(nodes)
    if profile.residual_sums:
        for scope in scopes:
            residual_sums(scope)
    if placed:
        ir.set_domain_opset(model, CONTRIB_DOMAIN, 1)
    for scope in reversed(scopes):  # bodies inside out, the top-level graph last
        scope.commit()
    placed = _merged(placed)
    write_metadata(model, placed, profile.target_cpu)
    return placed


def _kernel(
    graph: ir.Graph,
    node: onnx.NodeProto,
    annotations: Annotations,
    profile: BackendProfile,
    options: WeightOptions,
) -> Kernel:
    """How ``node``'s weight is quantized: per column unless placement gave it one scale; a
    gated product's up projection may carry its outlier columns only if it keeps per-column
    scales (one scale for the whole weight would round those divided columns to zero)."""

    def per_column(weight: str) -> bool:
        entry = annotations.tensors.get(weight)
        return entry is None or entry.axis is not None

    up = linear_factor(graph, node) if node.op_type == "MatMul" else None
    return Kernel(
        profile.weight_qmax,
        options.weight_method,
        per_column(node.input[1]),
        up is not None and per_column(up.input[1]),
    )


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
    kernel: Kernel,
    add: onnx.NodeProto | None = None,
    once: tuple[str, str, str] | None = None,
) -> list[Placed]:
    """MatMul or Gemm (and the bias ``add`` after a MatMul) -> DynamicQuantizeMatMul, or
    MatMulIntegerToFloat when the input was quantized ``once`` for several readers."""
    w, bias, output = _weight_and_bias(graph, node, add)
    qp = _write_kernel(graph, node, node.input[0], w, bias, output, kernel, once)
    return [
        _runtime_activation(node.input[0], node),
        Placed(node.input[1], "weight", qp, ((node.name, 1),), _bits(kernel.qmax), "int8"),
    ]


def _gated_matmul(
    graph: ir.Graph,
    node: onnx.NodeProto,
    kernel: Kernel,
    add: onnx.NodeProto | None = None,
    once: tuple[str, str, str] | None = None,
) -> list[Placed]:
    """A MatMul reading a gated product ``h`` -> ``DynamicQuantizeMatMul(h') + h'[:, J] @
    (s W[J])``: the outlier channels ``J`` (:data:`onnxq.place.rules.dynamic.GATED_OUTLIERS`)
    out of the quantized product (their weight rows zeroed) and multiplied in float beside it.
    ``h'`` is ``h`` with channels ``J`` divided by ``s`` = :data:`OUTLIER_SHRINK` through the
    up projection's weight columns, so they no longer set the kernel's run-time scale; without
    such a projection ``s`` is 1 and a Mul zeroes them (``add``, ``once``: None)."""
    channels = outlier_channels(graph, node, GATED_OUTLIERS)
    if channels is None:
        raise InternalError(f"{node.name!r}: the MatMuls of its gated input were lost")
    if not channels.size:
        return _matmul(graph, node, kernel)
    w, _, output = _weight_and_bias(graph, node, None)
    tensor, base, shrink = node.input[0], node.name, np.float32(1.0)
    up = linear_factor(graph, node) if kernel.up_columns_divisible else None
    if up is not None:  # the up projection writes h_J / s: exact, s is a power of two
        shrink = np.float32(OUTLIER_SHRINK)
        columns = _const(graph, up.input[1]).astype(np.float32)  # a copy
        columns[:, channels] /= shrink
        graph.set_initializer(up.input[1], columns)
        masked = tensor
    else:
        kept = np.ones(w.shape[0], np.float32)
        kept[channels] = 0.0
        mask = graph.add_initializer(graph.unique_name(f"{base}_inlier_mask"), kept)
        masked = graph.unique_name(f"{tensor}_inliers")
        graph.add_node("Mul", [tensor, mask], [masked], graph.unique_name(f"{base}_inliers"))
    inliers = w.copy()
    inliers[channels] = 0.0
    main = graph.unique_name(f"{output}_inliers")
    qp = _write_kernel(graph, node, masked, inliers, None, main, kernel, None)
    index = graph.add_initializer(graph.unique_name(f"{base}_outlier_channels"), channels)
    rows = graph.add_initializer(graph.unique_name(f"{base}_outlier_rows"), w[channels] * shrink)
    picked, side = graph.unique_name(f"{tensor}_outliers"), graph.unique_name(f"{output}_outliers")
    graph.add_node(
        "Gather", [tensor, index], [picked], graph.unique_name(f"{base}_outliers"), axis=-1
    )
    graph.add_node("MatMul", [picked, rows], [side], graph.unique_name(f"{base}_outlier_matmul"))
    graph.add_node("Add", [main, side], [output], graph.unique_name(f"{base}_outlier_add"))
    return [
        _runtime_activation(masked, node),
        Placed(node.input[1], "weight", qp, ((node.name, 1),), _bits(kernel.qmax), "int8"),
    ]


def _write_kernel(
    graph: ir.Graph,
    node: onnx.NodeProto,
    tensor: str,
    w: np.ndarray,
    bias: np.ndarray | None,
    output: str,
    kernel: Kernel,
    once: tuple[str, str, str] | None,
) -> QParams:
    """The kernel that multiplies ``tensor`` by ``w`` (int8 per column) into ``output``; the
    weight's qparams.  The weight's zero point is 0, the kernels' default: its input is left
    empty (a tensor of zeros, one per column, sends onnxruntime's GEMM down its per-column
    zero-point path for nothing)."""
    weight_name = node.input[1]
    qp = weight_qparams(w, 1 if kernel.per_column else None, kernel.qmax, kernel.method)
    stored = graph.add_initializer(
        graph.unique_name(f"{weight_name}_quantized"), quantize_weight(w, qp, kernel.qmax)
    )
    scale = graph.add_initializer(graph.unique_name(f"{weight_name}_scale"), qp.scale)
    if np.any(qp.zero_point):
        raise InternalError(f"{weight_name!r}: a dynamic kernel's weight with a zero point")
    bias_name = (
        graph.add_initializer(
            graph.unique_name(f"{node.name}_bias"), np.ascontiguousarray(bias, np.float32)
        )
        if bias is not None
        else ""
    )
    if once is None:
        op, inputs = "DynamicQuantizeMatMul", [tensor, stored, scale, "", bias_name]
    else:
        x_q, x_scale, x_zero = once
        op, inputs = "MatMulIntegerToFloat", [x_q, stored, x_scale, scale, x_zero, "", bias_name]
    while not inputs[-1]:  # optional inputs left out at the end
        inputs.pop()
    graph.add_node(
        op,
        inputs,
        [output],
        graph.unique_name(f"{node.name}_dynamic"),
        domain=CONTRIB_DOMAIN,
    )
    return qp


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
    kernel: Kernel,
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
        qp = weight_qparams(flat, 0, kernel.qmax, kernel.method)
        q = quantize_weight(flat, qp, kernel.qmax).reshape(dirs, rows, cols).transpose(0, 2, 1)
        scale = qp.scale.reshape(dirs, rows)
        quantized += [
            graph.add_initializer(graph.unique_name(f"{name}_quantized"), q),
            graph.add_initializer(graph.unique_name(f"{name}_scale"), scale),
            graph.add_initializer(
                graph.unique_name(f"{name}_zero_point"), np.zeros((dirs, rows), np.int8)
            ),
        ]
        shown = QParams(scale, np.zeros((dirs, rows), np.int8), 1, qp.method, qp.low, qp.high)
        placed.append(
            Placed(name, "weight", shown, ((node.name, index),), _bits(kernel.qmax), "int8")
        )
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
    [ir.Graph, onnx.NodeProto, Kernel, onnx.NodeProto | None, tuple[str, str, str] | None],
    list[Placed],
]
# rules whose writer reads the float MatMuls before it (a gated product's gate and up), which
# the other writers replace
WRITTEN_FIRST = frozenset({"dynamic_gated_matmul"})
SHARING_RULES = frozenset({"dynamic_matmul", "dynamic_gemm"})
WRITERS: dict[str, Writer] = {
    "dynamic_matmul": _matmul,
    "dynamic_gemm": _matmul,
    "dynamic_gated_matmul": _gated_matmul,
    "dynamic_lstm": _lstm,
}
