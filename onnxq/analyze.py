"""Per-layer error of a quantized model against its float model: where accuracy is lost.

Both models run on the same batches with every float tensor they share exposed as an output;
for each tensor the cosine similarity and the relative L2 error are accumulated batch by batch
(memory does not grow with the number of batches).  Tensors are listed in graph order, so the
first layer where the error jumps is the one to exclude or re-calibrate.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxq import ir
from onnxq.calibrate import augmented_session, run_batch
from onnxq.data import Batch, InputSpec, check_batch, model_inputs
from onnxq.errors import CalibrationDataError, UnsupportedModelError


@dataclass(frozen=True)
class LayerError:
    """Agreement of one tensor between the float and the quantized model."""

    tensor: str
    producer: str
    op_type: str
    cosine: float
    relative_error: float
    # values that are NaN/Inf in one model and not the same in the other (the cosine and the
    # error cover the values finite in both; equal non-finite values, a Log(0) in both, agree)
    nonfinite_mismatches: int = 0


@dataclass
class _Acc:
    dot: float = 0.0
    ref: float = 0.0
    got: float = 0.0
    diff: float = 0.0
    mismatches: int = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        finite = np.isfinite(a64) & np.isfinite(b64)
        if not finite.all():
            odd = ~finite
            same = (a64[odd] == b64[odd]) | (np.isnan(a64[odd]) & np.isnan(b64[odd]))
            self.mismatches += int((~same).sum())
            a64, b64 = a64[finite], b64[finite]
        self.dot += float(a64 @ b64)
        self.ref += float(a64 @ a64)
        self.got += float(b64 @ b64)
        self.diff += float((a64 - b64) @ (a64 - b64))


def analyze(
    float_model: onnx.ModelProto,
    quant_model: onnx.ModelProto,
    batches: Iterable[Batch],
    max_batches: int = 16,
    fused: bool = False,
) -> list[LayerError]:
    """Per-tensor error over up to ``max_batches`` batches (quantized model unfused by default:
    the Q/DQ graph's own arithmetic)."""
    float_model, quant_model = (ir.infer_shapes(_copy(m)) for m in (float_model, quant_model))
    fg, qg = ir.Graph(float_model), ir.Graph(quant_model)
    _same_inputs(model_inputs(fg), model_inputs(qg))
    drawn = _random_draws(fg)
    shared = [
        n.output[0]
        for n in fg.nodes
        if n.output
        and n.output[0] in qg.producer
        and fg.elem_type(n.output[0]) in (None, onnx.TensorProto.FLOAT)
        and n.op_type != "Constant"
        and n.output[0] not in fg.subgraph_reads
        and n.output[0] not in drawn
    ]
    if not shared:
        if any(
            fg.elem_type(n.output[0]) in (None, onnx.TensorProto.FLOAT)
            for n in fg.nodes
            if n.output and n.op_type != "Constant"
        ):
            raise UnsupportedModelError(
                "no float tensor of the float model has a namesake in the quantized model, so "
                "nothing can be compared: give the float model the quantized one was made from"
            )
        return []
    sessions = (
        augmented_session(float_model, fg, shared),
        augmented_session(quant_model, qg, shared, optimize=fused),
    )
    inputs = model_inputs(fg)
    acc = {t: _Acc() for t in shared}
    seen = 0
    for index, raw in enumerate(batches):
        if index >= max_batches:
            break
        batch = check_batch(raw, inputs, index)
        ref, got = (
            run_batch(s, shared, batch, index, what)
            for s, what in zip(sessions, ("float", "quantized"), strict=True)
        )
        for name, a, b in zip(shared, ref, got, strict=True):
            if a.shape != b.shape:
                # quantization never changes a tensor's shape: these are different models
                raise UnsupportedModelError(
                    f"tensor {name!r} has shape {list(a.shape)} in the float model but "
                    f"{list(b.shape)} in the quantized one (batch {index}): the quantized "
                    "model is not a quantization of this float model; give the float model "
                    "it was made from"
                )
            if a.dtype.kind == "f" and b.dtype.kind == "f":
                acc[name].add(a, b)
        seen += 1
    if seen == 0:
        raise CalibrationDataError("no batches to analyze; give calibration data with --calib")
    out = []
    for name in shared:
        sums = acc[name]
        cos = (
            sums.dot / math.sqrt(sums.ref * sums.got)
            if sums.ref > 0 and sums.got > 0
            else float(sums.diff == 0)
        )
        rel = math.sqrt(sums.diff / sums.ref) if sums.ref > 0 else math.sqrt(sums.diff)
        node = fg.producer[name]
        out.append(
            LayerError(name, node.name, node.op_type, round(cos, 6), round(rel, 6), sums.mismatches)
        )
    return out


def _random_draws(graph: ir.Graph) -> set[str]:
    """Tensors that are random draws: the outputs of RandomNormal(Like)/RandomUniform(Like)/
    Multinomial/Bernoulli, and of ops whose every non-constant input is one (a Cast or a
    scaling of a draw).  Two runs give two draws, so comparing them says nothing about
    quantization."""
    from onnxq.rewrites.simplify import NONDETERMINISTIC

    drawn: set[str] = set()
    for node in graph.nodes:  # topological order: a draw's readers come after it
        live = [i for i in node.input if i and not graph.is_const(i)]
        if node.op_type in NONDETERMINISTIC or (live and all(i in drawn for i in live)):
            drawn.update(o for o in node.output if o)
    return drawn


def _same_inputs(want: list[InputSpec], have: list[InputSpec]) -> None:
    """The quantized model must read the float model's inputs (names and element types)."""
    mine = {spec.name: spec.dtype for spec in want}
    theirs = {spec.name: spec.dtype for spec in have}
    if mine != theirs:

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


def write_analysis(path: str | Path, layers: list[LayerError]) -> None:
    """JSON, or an HTML table for a ``.html`` path (atomically)."""
    p = Path(path)
    if p.suffix.lower() in (".html", ".htm"):
        rows = "".join(
            f"<tr><td>{html.escape(x.tensor)}</td><td>{html.escape(x.op_type)}</td>"
            f"<td>{x.cosine:.6f}</td><td>{x.relative_error:.4g}</td>"
            f"<td>{x.nonfinite_mismatches}</td></tr>"
            for x in layers
        )
        text = (
            "<!doctype html><meta charset='utf-8'><title>onnxq analyze</title>"
            "<table border=1><tr><th>tensor</th><th>op</th><th>cosine</th>"
            "<th>relative error</th><th>NaN/Inf mismatches</th></tr>"
            f"{rows}</table>"
        )
    else:
        text = json.dumps({"layers": [asdict(x) for x in layers]}, indent=1) + "\n"
    ir.atomic_write_bytes(p, text.encode("utf-8"))
