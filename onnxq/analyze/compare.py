"""Per-layer error of a quantized model against its float model: where accuracy is lost.

Both models run on the same batches with every float tensor they share exposed as an output;
for each tensor the cosine similarity and the relative L2 error are accumulated batch by batch
(memory does not grow with the number of batches).  Tensors are listed in graph order, so the
first layer where the error jumps is the one to exclude or re-calibrate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.analyze.advice import advise, half_grid_input, quantized_op, weight_sqnr_db
from onnxq.analyze.error_stats import ErrorSums
from onnxq.analyze.layer_error import LayerError
from onnxq.analyze.view import print_analysis, write_analysis
from onnxq.calibrate.plan import DEFAULT_MEMORY_BUDGET, budget_groups
from onnxq.calibrate.session import augmented_session, run_batch
from onnxq.data.sources import Batch, InputSpec, check_batch, model_inputs
from onnxq.errors import CalibrationDataError, UnsupportedModelError


def analyze(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    batches: Iterable[Batch],
    max_batches: int = 16,
    fused: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> list[LayerError]:
    """Per-tensor error over up to ``max_batches`` batches (quantized model unfused by default:
    the Q/DQ graph's own arithmetic), accumulated and local (:class:`LayerError`).

    One comparison model holds the float model and two copies of the quantized one
    (:func:`onnxq.ir.twin_model`); its tensors are exposed in groups that stay under
    ``memory_budget`` bytes per batch (one session per group, as calibration does), so memory
    does not grow with the model's activations or the number of batches."""
    float_model, quant_model = (ir.infer_shapes(_copy(m)) for m in (float_model, quant_model))
    fg, qg = ir.Graph(float_model), ir.Graph(quant_model)
    inputs = model_inputs(fg)
    _same_inputs(inputs, model_inputs(qg))
    shared = _compared(fg, qg)
    if not shared:
        return []
    held = [
        check_batch(raw, inputs, i) for i, raw in enumerate(itertools.islice(batches, max_batches))
    ]
    if not held:
        raise CalibrationDataError("no batches to analyze; give calibration data with --calib")
    twin = ir.twin_model(float_model, quant_model)  # converts the float model's opset up
    pairs = _pairs(shared, twin)
    sums = _measure(twin, pairs, held, fused, memory_budget, _sizes(float_model, held[0]))
    return [_layer(name, fg, qg, twin, sums) for name in shared]


def quantized_in_bodies(quant_model: onnx.ModelProto) -> dict[str, int]:
    """Top-level node -> the QuantizeLinear nodes inside its If/Loop/Scan bodies: ops that
    :func:`analyze` does not rank (it compares top-level tensors; their error shows in the
    outputs of the node that holds them)."""
    counts = {}
    for node in quant_model.graph.node:
        inner = sum(
            n.op_type == "QuantizeLinear"
            for attr in node.attribute
            for body in ir.attr_graphs(attr)
            for n in ir.every_node(body)
        )
        if inner:
            counts[node.name or node.output[0]] = inner
    return counts


def _compared(fg: ir.Graph, qg: ir.Graph) -> list[str]:
    """The float tensors of the float model that the quantized model computes too."""
    drawn = _random_draws(fg)
    shared = [  # every output: an If's or an LSTM's later outputs are often graph outputs
        out
        for n in fg.nodes
        if n.op_type != "Constant"
        for out in n.output
        if out
        and out in qg.producer
        and fg.elem_type(out) in (None, onnx.TensorProto.FLOAT)
        and out not in fg.subgraph_reads
        and out not in drawn
    ]
    if not shared and any(
        fg.elem_type(n.output[0]) in (None, onnx.TensorProto.FLOAT)
        for n in fg.nodes
        if n.output and n.op_type != "Constant"
    ):
        raise UnsupportedModelError(
            "no float tensor of the float model has a namesake in the quantized model, so "
            "nothing can be compared: give the float model the quantized one was made from"
        )
    return shared


def _pairs(shared: list[str], twin: ir.Twin) -> dict[str, list[str]]:
    """Float tensor -> the comparison model's tensors compared with it."""
    pairs = {t: [twin.accumulated(t), twin.local(t)] for t in shared}
    for fake, tensor in sorted(twin.fake_quantized.items()):
        pairs.setdefault(tensor, []).append(fake)
    return pairs


def _sizes(model: onnx.ModelProto, first: Batch) -> dict[str, int]:
    """Bytes of one batch of each tensor (shapes inferred for the first batch's inputs)."""
    shapes = ir.shapes_for_inputs(model, {k: v.shape for k, v in first.items()})
    out = {}
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d if isinstance(d, int) and d > 0 else 64
        out[name] = 4 * n
    return out


def _measure(
    twin: ir.Twin,
    pairs: dict[str, list[str]],
    held: list[Batch],
    fused: bool,
    budget: int,
    sizes: dict[str, int],
) -> dict[tuple[str, str], ErrorSums]:
    """Run the comparison model over ``held`` once per group of tensors and sum the errors."""
    tg = ir.Graph(twin.model)
    sums = {(ref, other): ErrorSums() for ref, others in pairs.items() for other in others}
    for group in _groups(pairs, sizes, budget):
        names = [n for ref in group for n in (ref, *pairs[ref])]
        with ir.pruned(twin.model, names) as part:
            session = augmented_session(part, tg, names, optimize=fused)
        for index, batch in enumerate(held):
            values = dict(zip(names, run_batch(session, names, batch, index), strict=True))
            samples = _samples(batch)
            for ref in group:
                for other in pairs[ref]:
                    _add(sums[ref, other], ref, values[ref], values[other], index, samples)
            del values
        del session
    return sums


def _groups(pairs: dict[str, list[str]], sizes: dict[str, int], budget: int) -> list[list[str]]:
    """Float tensors in groups whose exposed values (each with its copies) fit ``budget``."""
    exposed = {ref: sizes.get(ref, 4 * 2**20) * (1 + len(o)) for ref, o in pairs.items()}
    return budget_groups(list(pairs), exposed, budget)


def _add(sums: ErrorSums, name: str, a: Any, b: Any, index: int, samples: int) -> None:
    if a.shape != b.shape:
        # quantization never changes a tensor's shape: these are different models
        raise UnsupportedModelError(
            f"tensor {name!r} has shape {list(a.shape)} in the float model but "
            f"{list(b.shape)} in the quantized one (batch {index}): the quantized "
            "model is not a quantization of this float model; give the float model "
            "it was made from"
        )
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        sums.add(a, b, samples)


def _samples(batch: Batch) -> int:
    """The batch's sample count: the leading size of its inputs (1 for scalars)."""
    sizes = [v.shape[0] for v in batch.values() if getattr(v, "ndim", 0) >= 1]
    return int(sizes[0]) if sizes and all(s == sizes[0] for s in sizes) else 1


def _layer(
    name: str,
    fg: ir.Graph,
    qg: ir.Graph,
    twin: ir.Twin,
    sums: dict[tuple[str, str], ErrorSums],
) -> LayerError:
    acc, local = sums[name, twin.accumulated(name)], sums[name, twin.local(name)]
    node, qnode = fg.producer[name], _writer(qg, name, fg.producer[name])
    quantized = quantized_op(qg, qnode)
    inputs = [
        sums[x, dq]
        for dq, x in twin.fake_quantized.items()
        if dq.removesuffix(ir.LOCAL) in qnode.input
    ]
    input_sqnr = [s for x in inputs if (s := x.sqnr_db) is not None]
    worst = acc.worst_samples()
    layer = LayerError(
        name,
        node.name,
        node.op_type,
        round(acc.cosine, 6),
        round(acc.relative_error, 6),
        acc.mismatches,
        _round(acc.sqnr_db),
        quantized,
        round(local.cosine, 6),
        _round(local.sqnr_db),
        _round(min(input_sqnr)) if quantized and input_sqnr else None,
        _round(weight_sqnr_db(qg, qnode)) if quantized else None,
        round(local.offset_share, 3) if quantized else None,
        round(min(acc.samples), 6) if acc.samples else None,
        worst if acc.samples else (),
    )
    if not quantized:
        return layer
    layer = replace(layer, input_half_grid=half_grid_input(qg, qnode))
    return replace(layer, advice=advise(layer, local, inputs))


def _writer(qg: ir.Graph, name: str, node: onnx.NodeProto) -> onnx.NodeProto:
    """The node of the quantized model that computes the float model's ``name`` (written by
    ``node``): its producer, or, where the quantized model computes it in FP16/BF16 and casts
    it back under its name (a graph output, ``onnxq.materialize.typing``), the node before
    that Cast (the same node as the float model's, by name; by op type when unnamed)."""
    qnode = qg.producer[name]
    if qnode.op_type != "Cast" or (node.op_type == "Cast" and qnode.name == node.name):
        return qnode
    inner = qg.producer.get(qnode.input[0]) if qnode.input else None
    if inner is None or inner.op_type in ir.QDQ_OPS:
        return qnode
    same = inner.name == node.name if node.name else inner.op_type == node.op_type
    return inner if same else qnode


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _random_draws(graph: ir.Graph) -> set[str]:
    """Tensors that are random draws: the outputs of RandomNormal(Like)/RandomUniform(Like)/
    Multinomial/Bernoulli, and of ops whose every non-constant input is one (a Cast or a
    scaling of a draw).  Two runs give two draws, so comparing them says nothing about
    quantization."""
    from onnxq.prepare.simplify import NONDETERMINISTIC

    drawn: set[str] = set()
    for node in graph.nodes:  # topological order: a draw's readers come after it
        live = [i for i in node.input if i and not graph.is_const(i)]
        if node.op_type in NONDETERMINISTIC or (live and all(i in drawn for i in live)):
            drawn.update(o for o in node.output if o)
    return drawn


def _same_inputs(want: list[InputSpec], have: list[InputSpec]) -> None:
    """The quantized model must read the float model's inputs (names and element types; an
    FP32 input may be FP16/BF16 there: a model written without ``keep_io_types``, which the
    comparison model feeds through a Cast)."""
    mine = {spec.name: spec.dtype for spec in want}
    theirs = {spec.name: spec.dtype for spec in have}
    lowered = {
        name: mine[name]
        for name, dtype in theirs.items()
        if str(dtype) in ("float16", "bfloat16") and mine.get(name) == np.float32
    }
    if mine != {**theirs, **lowered}:

        def show(specs: dict[str, np.dtype]) -> str:  # type: ignore[type-arg]
            return ", ".join(f"{n} ({d})" for n, d in sorted(specs.items())) or "none"

        raise UnsupportedModelError(
            f"the quantized model's inputs [{show(theirs)}] are not the float model's "
            f"[{show(mine)}]: it is not a quantization of this float model; give the float "
            "model it was made from"
        )


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


__all__ = ["LayerError", "analyze", "print_analysis", "quantized_in_bodies", "write_analysis"]
