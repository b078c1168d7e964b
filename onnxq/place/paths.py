"""Paths through the graph that decide placement before any data is seen: shape/index
computations (never quantized), the ops in front of a logarithm or a tree ensemble (kept
float), grouped convs and the 1-D convs in front of a LayerNormalization (checked against the
calibration data by :mod:`onnxq.place.exclusions`)."""

from __future__ import annotations

import functools

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.place.heads import DATA_FIRST_OPS


def shape_path(
    graph: ir.Graph, profile: BackendProfile, outer: frozenset[str] = frozenset()
) -> frozenset[str]:
    """Tensors computed from shapes or indices (downstream of Shape/Size/...); ``outer``: the
    enclosing scopes' such tensors, which a control-flow body may read."""
    path: set[str] = set(outer)
    for node in graph.nodes:
        outs = [o for o in node.output if o]
        if node.op_type in profile.shape_ops:
            path.update(outs)
            continue
        # a control-flow node computes from what its bodies read, not only its condition
        reads = sorted(ir.node_reads(node)) if ir.has_subgraph(node) else node.input
        live = [t for t in reads if t and not graph.is_const(t)]
        if live and all(t in path for t in live):
            path.update(outs)
    return frozenset(path - outer)


def grouped_conv_inputs(graph: ir.Graph) -> dict[str, str]:
    """Grouped (depthwise) Conv node name -> its activation input."""
    return {
        n.name: n.input[0]
        for n in graph.nodes
        if n.op_type == "Conv"
        and n.domain in ir.DEFAULT_DOMAINS
        and n.input
        and int(ir.node_attrs(n).get("group", 1)) > 1
    }


# ops a per-position normalisation is reached through (a feature encoder's convs and GELUs,
# the Transpose to channels-last): they keep a quiet position quiet
POSITION_PATH_OPS = frozenset(
    [
        "Conv",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Erf",
        "Tanh",
        "Sigmoid",
        "Relu",
        "LeakyRelu",
        "Gelu",
        "Pow",
        "Clip",
        "Neg",
        "Elu",
        "Selu",
        "Softplus",
        "HardSigmoid",
        "HardSwish",
        "Mish",
        "Identity",
        "Transpose",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
    ]
)


def position_norm_convs(graph: ir.Graph) -> dict[str, str]:
    """1-D Conv node name -> its activation input, for the convs whose output reaches a
    ``LayerNormalization`` through :data:`POSITION_PATH_OPS` only: that normalisation rescales
    every position (a frame) to the same size, so a position that int8 leaves few levels (a
    quiet frame far below the loud ones) comes out as large as the rest, noise included.
    One walk up from every LayerNormalization, as :func:`precision_paths` walks from a Log."""
    found: dict[str, str] = {}

    def step(_tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if (
            node is None
            or node.domain not in ir.DEFAULT_DOMAINS
            or node.op_type not in POSITION_PATH_OPS
        ):
            return []
        if node.op_type == "Conv":
            weight = graph.shape(node.input[1]) if len(node.input) > 1 else None
            if weight is not None and len(weight) == 3:
                found[node.name] = node.input[0]
        data_first = node.op_type == "Conv" or node.op_type in DATA_FIRST_OPS
        return [
            x for x in (node.input[:1] if data_first else node.input) if x and not graph.is_const(x)
        ]

    graph.walk_up(
        [
            n.input[0]
            for n in graph.nodes
            if n.op_type == "LayerNormalization" and n.input and n.input[0]
        ],
        step,
    )
    return found


# ops that carry a value's magnitude into a logarithm (or a tree's thresholds) without
# squashing it: linear maps, products, powers and sums, reductions, floors (Clip/Max with an
# epsilon), data movement
LOG_PATH_OPS = frozenset(
    [
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "Einsum",
        "BatchNormalization",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Abs",
        "Pow",
        "Sqrt",
        "Max",
        "Min",
        "Clip",
        "Sum",
        "Mean",
        "ReduceSum",
        "ReduceMean",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "AveragePool",
        "GlobalAveragePool",
        "Identity",
        "Cast",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Gather",
        "Concat",
        "Pad",
        "Expand",
        "Tile",
    ]
)
# log-path ops whose inputs after the first are shapes, sizes, axes, bounds, statistics or
# exponents
LOG_DATA_FIRST_OPS = DATA_FIRST_OPS | frozenset(
    [
        "Pad",
        "Expand",
        "Tile",
        "ReduceSum",
        "ReduceMean",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "BatchNormalization",
        "Pow",
    ]
)
# ONNX-ML ops that compare their input features with learned split thresholds
TREE_OPS = frozenset({"TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble"})


def precision_paths(graph: ir.Graph) -> dict[str, str]:
    """Nodes whose output reaches a ``Log`` or a tree ensemble through :data:`LOG_PATH_OPS`
    alone -> why they stay float.

    A logarithm spreads out small values: a power spectrum's quiet bins, 1e-6 next to 1e2,
    are as far apart after it as its loud ones.  int8's uniform steps (1/127 of the peak)
    erase them, so the spectrogram front ends of audio models (STFT/CQT convs, squares and
    sums, a mel MatMul, then Log) lose everything they carry.  A tree ensemble (scikit-learn's
    random forests and boosted trees, ``ai.onnx.ml``) compares each feature with hundreds of
    split thresholds: a feature moved by one int8 step crosses some of them and changes a
    leaf, so the scaling, PCA or other linear ops in front of the trees stay float too.  The
    walk up from each such op stops at any op not listed (an activation such as Relu or
    Softmax ends a learned layer's output), at graph inputs and at constants."""
    found: dict[str, str] = {}
    for sink in graph.nodes:
        if not sink.input or not sink.input[0]:
            continue
        if sink.op_type == "Log" and sink.domain in ir.DEFAULT_DOMAINS:
            why = (
                f"its output reaches the logarithm {sink.name!r} through linear, power and "
                "data-movement ops only: quantization steps sized for its largest values "
                "would erase the small values the logarithm spreads out, so it stays float"
            )
        elif sink.op_type in TREE_OPS and sink.domain == "ai.onnx.ml":
            why = (
                f"its output reaches the split thresholds of the tree ensemble {sink.name!r} "
                "through linear and data-movement ops only: a feature moved by one "
                "quantization step crosses thresholds and changes the trees' decisions, so it "
                "stays float"
            )
        else:
            continue
        path: list[str] = []
        graph.walk_up([sink.input[0]], functools.partial(_log_path_step, graph, path))
        for name in path:
            found.setdefault(name, why)
    return found


def _log_path_step(
    graph: ir.Graph, path: list[str], _tensor: str, node: onnx.NodeProto | None
) -> list[str]:
    """Add ``node`` to ``path`` and give the tensors to walk on to, if it carries magnitudes."""
    if node is None or node.domain not in ir.DEFAULT_DOMAINS or node.op_type not in LOG_PATH_OPS:
        return []
    path.append(node.name)
    inputs = node.input[:1] if node.op_type in LOG_DATA_FIRST_OPS else node.input
    return [x for x in inputs if x and not graph.is_const(x)]


# ops whose output is bounded whatever their input: a product with one of them is a gate
BOUNDED_OPS = frozenset({"Sigmoid", "HardSigmoid", "Tanh", "Softmax", "Softsign", "Erf"})


def gated_products(graph: ir.Graph) -> frozenset[str]:
    """The outputs of Muls of two activations neither of which is bounded: a gated linear
    unit's output (``SiLU(x W1) * (x W2)``, which SwiGLU's down projection reads).  ``x *
    Sigmoid(x)`` (SiLU), GELU's ``x * 0.5 * (1 + Erf(...))`` and other gates are not."""
    found = set()
    for node in graph.nodes:
        if node.op_type != "Mul" or node.domain not in ir.DEFAULT_DOMAINS:
            continue
        factors = [t for t in node.input if t and not graph.is_const(t)]
        if len(factors) == 2 and not any(_bounded(graph, t) for t in factors):
            found.add(node.output[0])
    return frozenset(found)


def _bounded(graph: ir.Graph, tensor: str, depth: int = 4) -> bool:
    """Whether ``tensor`` comes out of a bounded op, possibly through constant shifts and
    scales (GELU's ``0.5 * (1 + Erf(x / sqrt 2))``)."""
    node = graph.producer.get(tensor)
    if node is None or depth == 0:
        return False
    if node.op_type in BOUNDED_OPS:
        return True
    live = [t for t in node.input if t and not graph.is_const(t)]
    affine = node.op_type in ("Add", "Sub", "Mul", "Div") and len(live) == 1
    return affine and _bounded(graph, live[0], depth - 1)
