"""Simplify passes: make weights visible as constants and remove what Q/DQ placement trips on.

Each pass takes an :class:`onnxq.ir.Graph`, edits it through its methods and returns whether it
changed anything; :func:`simplify` runs them to a fixed point.  Every pass keeps the model's
outputs numerically equal (to float rounding) to the input's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxq import ir
from onnxq.errors import InternalError, OnnxqError
from onnxq.prepare.bias_add import fold_bias_add, fold_channel_mul, scaled_weight
from onnxq.prepare.hardswish import fuse_hardswish
from onnxq.prepare.pad import fold_pad
from onnxq.prepare.prelu import decompose_prelu
from onnxq.prepare.rsqrt import reciprocal_sqrt_to_div

Pass = Callable[[ir.Graph], bool]

NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)
FOLD_LIMIT_BYTES = 64 * 2**20


def constants_to_initializers(graph: ir.Graph) -> bool:
    """``Constant`` nodes become initializers (both are weights to the rules)."""
    moved = []
    for name, node in graph.constant_nodes.items():
        if name in graph.graph_outputs:
            continue
        value = ir.constant_node_value(node)
        if value is None:
            continue
        graph.add_initializer(name, value)
        moved.append(node)
    graph.remove_nodes(moved)
    return bool(moved)


def remove_identities(graph: ir.Graph) -> bool:
    """Drop Identity and inference-mode Dropout, rewiring their readers."""
    doomed = []
    for node in graph.nodes:
        if node.op_type not in ("Identity", "Dropout") or node.domain not in ir.DEFAULT_DOMAINS:
            continue
        if node.op_type == "Dropout":
            if any(node.output[1:]) and any(graph.consumers.get(o) for o in node.output[1:] if o):
                continue
            if len(node.input) > 2 and node.input[2]:
                mode = graph.const_value(node.input[2])
                if mode is None or bool(mode):
                    continue
        out, src = node.output[0], node.input[0]
        if out in graph.graph_outputs or out in graph.subgraph_reads:
            continue
        graph.replace_uses(out, src)
        doomed.append(node)
    graph.remove_nodes(doomed)
    return bool(doomed)


def sum_to_add(graph: ir.Graph) -> bool:
    """A two-input ``Sum`` (Caffe2's residual joins) becomes the ``Add`` it is: same
    broadcasting, same single rounding, and the residual and integer-Add rules match Add."""
    changed = False
    for node in graph.nodes:
        if (
            node.op_type == "Sum"
            and node.domain in ir.DEFAULT_DOMAINS
            and len(node.input) == 2
            and all(node.input)
        ):
            node.op_type = "Add"
            changed = True
    return changed


def fold_constants(graph: ir.Graph) -> bool:
    """Evaluate nodes whose inputs are all constant; fold Shape of static shapes."""
    from onnx.reference import ReferenceEvaluator

    folded = []
    for node in graph.nodes:
        if (
            node.domain not in ir.DEFAULT_DOMAINS
            or node.op_type in NONDETERMINISTIC
            or ir.has_subgraph(node)
            or node.op_type == "Constant"
        ):
            continue
        if any(o in graph.graph_outputs for o in node.output):
            continue
        if node.op_type == "Shape":
            shape = graph.shape(node.input[0])
            if shape is None or not all(isinstance(d, int) for d in shape) or len(node.attribute):
                continue
            graph.add_initializer(node.output[0], np.asarray(shape, dtype=np.int64))
            folded.append(node)
            continue
        inputs = [i for i in node.input if i]
        if not inputs or not all(graph.is_const(i) for i in inputs):
            continue
        values = {i: graph.const_value(i) for i in inputs}
        if any(v is None for v in values.values()):
            continue
        try:
            outputs = _evaluate(ReferenceEvaluator, graph, node, values)  # type: ignore[arg-type]
        except Exception:
            continue  # the op stays; folding is an optimisation
        size_in = sum(v.nbytes for v in values.values() if v is not None)
        size_out = sum(v.nbytes for v in outputs)
        if size_out > max(FOLD_LIMIT_BYTES, 2 * size_in) and size_out > 2**20:
            continue
        for name, value in zip(node.output, outputs, strict=False):
            if name:
                graph.add_initializer(name, value)
        folded.append(node)
    graph.remove_nodes(folded)
    return bool(folded)


def _evaluate(
    evaluator: type, graph: ir.Graph, node: onnx.NodeProto, values: dict[str, np.ndarray]
) -> list[np.ndarray]:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in values.items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o]
    sub = helper.make_graph([node], "fold", [], outs, inits)
    model = helper.make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    results = evaluator(model).run(None, {})
    return [np.asarray(r) for r in results]


def fold_batchnorm(graph: ir.Graph) -> bool:
    """BatchNormalization after Conv/ConvTranspose/Gemm folds into that op's weight and bias."""
    doomed = []
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1:
            continue
        producer = graph.producer.get(bn.input[0])
        if producer is None or producer.op_type not in ir.BIAS_READERS:
            continue
        if (
            len(graph.consumers.get(bn.input[0], [])) != 1
            or bn.input[0] in graph.graph_outputs
            or bn.input[0] in graph.subgraph_reads  # the folded op takes over the BN's name
        ):
            continue
        params = [graph.const_value(t) for t in bn.input[1:5]]
        weight = graph.const_value(producer.input[1])
        if weight is None or any(p is None for p in params):
            continue
        eps = float(ir.node_attrs(bn).get("epsilon", 1e-5))
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        scale = gamma / np.sqrt(var + eps)
        folded = scaled_weight(producer, weight.astype(np.float64), scale)
        if folded is None:
            continue
        bias_name = producer.input[2] if len(producer.input) > 2 else ""
        bias = graph.const_value(bias_name) if bias_name else np.zeros(len(scale))
        if bias is None or np.asarray(bias).shape not in ((len(scale),), ()):
            continue
        new_bias = (np.asarray(bias, dtype=np.float64) - mean) * scale + beta
        w_name = graph.unique_name(f"{producer.input[1]}_bn")
        b_name = graph.unique_name(f"{producer.name}_bias_bn")
        graph.add_initializer(w_name, folded.astype(weight.dtype))
        graph.add_initializer(b_name, new_bias.astype(weight.dtype))
        producer.input[1] = w_name
        if len(producer.input) > 2:
            producer.input[2] = b_name
        else:
            producer.input.append(b_name)
        # the folded op now produces the BN's tensor, so every tensor name keeps its meaning
        # (the op's own output was read only by the BN)
        producer.output[0] = bn.output[0]
        doomed.append(bn)
    graph.remove_nodes(doomed)
    return bool(doomed)


def fold_matmul_batchnorm(graph: ir.Graph) -> bool:
    """BatchNormalization over the columns of a MatMul with a constant [K, C] weight, directly
    (a 2-D product) or through a Flatten that keeps the last axis (LeViT's linear + BatchNorm1d
    on [batch * tokens, C]): the scale goes into the weight's columns, the shift becomes an
    Add of a constant where the BatchNormalization was."""
    doomed = []
    for bn in graph.nodes:
        if (
            bn.op_type != "BatchNormalization"
            or bn.domain not in ir.DEFAULT_DOMAINS
            or len([o for o in bn.output if o]) != 1
        ):
            continue
        src = bn.input[0]
        between = graph.producer.get(src)
        if between is not None and between.op_type == "Flatten":
            rank = len(graph.shape(between.input[0]) or ())
            axis = int(ir.node_attrs(between).get("axis", 1))
            if rank < 2 or (axis + rank if axis < 0 else axis) != rank - 1:
                continue
            matmul = graph.producer.get(between.input[0])
            chain = [between.input[0], src]
        else:
            matmul, chain = between, [src]
            if len(graph.shape(src) or ()) != 2:  # BatchNorm's channel axis 1 is then C
                continue
        if matmul is None or matmul.op_type != "MatMul" or matmul.domain not in ir.DEFAULT_DOMAINS:
            continue
        # the product changes (scaled columns): only the next op and Shape ops may read it
        if any(
            t in graph.graph_outputs
            or t in graph.subgraph_reads
            or sum(r.op_type != "Shape" for r, _ in graph.consumers.get(t, [])) != 1
            for t in chain
        ):
            continue
        weight = graph.const_value(matmul.input[1])
        params = [graph.const_value(t) for t in bn.input[1:5]]
        if weight is None or weight.ndim != 2 or any(p is None for p in params):
            continue
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        if any(p.shape != gamma.shape for p in (beta, mean, var)):
            continue
        eps = float(ir.node_attrs(bn).get("epsilon", 1e-5))
        scale = gamma / np.sqrt(var + eps)
        folded = scaled_weight(matmul, weight.astype(np.float64), scale)  # columns, as a Gemm's
        if folded is None:
            continue
        w_name = graph.unique_name(f"{matmul.input[1]}_bn")
        shift = graph.unique_name(f"{bn.name}_shift")
        graph.add_initializer(w_name, folded.astype(weight.dtype))
        graph.add_initializer(shift, (beta - mean * scale).astype(weight.dtype))
        graph.set_input(matmul, 1, w_name)
        graph.add_node("Add", [src, shift], [bn.output[0]], graph.unique_name(f"{bn.name}_add"))
        doomed.append(bn)
    graph.remove_nodes(doomed)
    return bool(doomed)


DEFAULT_PASSES: tuple[Pass, ...] = (
    constants_to_initializers,
    remove_identities,
    sum_to_add,
    fold_constants,
    fold_pad,
    fold_batchnorm,
    fold_matmul_batchnorm,
    fold_channel_mul,
    fold_bias_add,
    fuse_hardswish,
    decompose_prelu,
    reciprocal_sqrt_to_div,
)


def _run_everywhere(p: Pass, graph: ir.Graph) -> bool:
    """Run ``p`` on ``graph`` and then on the bodies inside it, each committed after a change
    (and indexed afresh after its enclosing graph's commit); True if anything changed."""
    changed = p(graph)
    if changed:
        graph.commit()
    inner = False
    for body in ir.child_graphs(graph):
        inner |= _run_everywhere(p, body)
    if inner:
        graph.reindex()  # what its bodies read from it may have changed
    return changed or inner


def simplify(
    model: onnx.ModelProto, passes: tuple[Pass, ...] = DEFAULT_PASSES, max_rounds: int = 8
) -> tuple[onnx.ModelProto, list[str]]:
    """Run ``passes`` to a fixed point, in the top-level graph and in every If/Loop/Scan
    body; returns the model and the names of passes that fired."""
    graph = ir.Graph(model)
    fired: list[str] = []
    for _ in range(max_rounds):
        changed = False
        for p in passes:
            try:
                modified = _run_everywhere(p, graph)
            except OnnxqError:
                raise
            except Exception as exc:  # onnxq's own pass crashed: its bug, whatever the model
                raise InternalError(
                    f"simplify pass {p.__name__} failed on this model: "
                    f"{type(exc).__name__}: {exc}; --no-simplify skips the simplify passes "
                    "until it is fixed"
                ) from exc
            if modified:
                fired.append(p.__name__)
                changed = True
        if not changed:
            break
    # removing Identity nodes can leave several layers reading one bias again (the torch
    # exporter's Identity copies of one initializer): each gets its own, as at load
    ir.unshare_biases(graph.model.graph)
    return ir.infer_shapes(graph.model), sorted(set(fired))
