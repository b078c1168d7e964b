"""Block reconstruction (``adaround_mode: block``): the rounding of every weight of a block of
layers learned together against the float model's output of the block, block after block on
the quantized prefix (BRECQ, Li et al. 2021; the asymmetric input of QDrop, Wei et al. 2022).

Sequential AdaRound (:mod:`onnxq.recover.seqround`) fits one layer at a time to that layer's
float output: a quadratic problem, but each layer ignores the activations after it (a ReLU6
that clips, the fake quantizer of the next layer's input).  Here a block
(:mod:`onnxq.recover.blocks`: for a MobileNetV2 one inverted-residual block) is cut out of the
model with Q/DQ placed (:mod:`onnxq.recover.blockprogram`), its input taken from that model
(every earlier block quantized and rounded as the run will write it), its internal
activations fake-quantized with the ranges the run will write, and the soft roundings of all
its layers move together by Adam to minimise::

    E || block_q(x_q) - block_f(x_f) ||^2 / (the same at round-to-nearest)
      + REGULARIZATION * mean(1 - |2h - 1|^beta)

with AdaRound's regulariser and schedule (:mod:`onnxq.recover.rounding`).  Each step runs the
block forward and back on a few images of a sample (:mod:`onnxq.recover.blocklearn`; at most
:data:`BLOCK_IMAGES` of the even calibration batches, fewer when the block's input and output
for them would pass the memory budget).  The learned rounding is kept only when it lowers the
block's output error on the odd batches against round-to-nearest, and then only if the
model's output error on the odd batches drops (as sequential AdaRound).  Layers outside every
block keep round-to-nearest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.recover.adaround import ChosenWeight, rounding_targets
from onnxq.recover.blocklearn import BlockSample, learn_block
from onnxq.recover.blockprogram import block_program
from onnxq.recover.blocks import Block, find_blocks
from onnxq.recover.engines import get_engine
from onnxq.recover.outputs import OutputDrift, pruned_session, run_session
from onnxq.runtime.progress import counted

BLOCK_IMAGES = 32  # images of the even batches a block is fitted on (as many judge it)


@dataclass(frozen=True)
class BlockRounding:
    """What block reconstruction did to one block: its layers, the block's output error
    (mean squared, per value, on the odd batches' sample) at round-to-nearest and learned, the
    model's output error with the block at each, and which one it keeps."""

    input: str
    output: str
    layers: list[str]
    images: int
    steps: int
    mse_nearest: float | None
    mse_learned: float | None
    kept: str  # "learned", "nearest", or "skipped: <why>"
    changed: float = 0.0  # share of the integers that differ from round-to-nearest
    model_error_nearest: float | None = None
    model_error_learned: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def block_adaround(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    profile: BackendProfile,
    options: RecoveryOptions,
    calibration: CalibrationOptions,
    weights: WeightOptions,
    data: Iterable[Batch],
    inputs: list[InputSpec],
) -> tuple[dict[str, ChosenWeight], list[BlockRounding]]:
    """Learn the rounding of the quantized Conv weights of ``model`` (not edited) block by
    block on the quantized prefix (``qparams``: the activation ranges); returns the chosen
    weights (by weight tensor; others round to nearest) and one entry per block."""
    from onnxq.materialize.qdq import materialize

    graph = ir.Graph(model)
    targets = {t.layer.weight: t for t in rounding_targets(graph, annotations, profile, weights)}
    weight_of = {t.layer.node: w for w, t in targets.items() if t.layer.op_type == "Conv"}
    blocks = find_blocks(graph, weight_of)
    if not blocks:
        return {}, []

    def quantized(chosen_now: dict[str, ChosenWeight]) -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        materialize(copy, annotations, qparams, profile, weights, chosen_now)
        return copy

    budget = calibration.memory_budget_mb * 2**20
    judge = OutputDrift(model, data, inputs, calibration.max_batches, budget, every=(2, 1))
    engine = get_engine(options.adaround_engine).conv()
    chosen: dict[str, ChosenWeight] = {}
    current = quantized(chosen)
    error = judge(current)
    report: list[BlockRounding] = []
    label = "block reconstruction"
    for block in counted(blocks, label, calibration.progress, len(blocks), unit="block"):
        learned = {n: weight_of[n] for n in block.nodes if n in weight_of}
        program = block_program(current, block.input, block.output, learned)
        if isinstance(program, str):
            report.append(_skipped(block, learned, f"skipped: the block {program}"))
            continue
        sample = capture_block(model, current, block, data, inputs, calibration, budget)
        if sample is None:
            report.append(_skipped(block, learned, "skipped: no calibration image"))
            continue
        found, fields = learn_block(program, graph, targets, sample, engine, options.adaround_steps)
        entry = BlockRounding(block.input, block.output, list(learned), *fields)
        if entry.kept == "learned":
            trial = quantized({**chosen, **found})
            after = judge(trial)
            kept = "learned" if after < error else "nearest"
            entry = replace(entry, model_error_nearest=error, model_error_learned=after, kept=kept)
            if kept == "learned":
                chosen, current, error = {**chosen, **found}, trial, after
        report.append(entry)
    return chosen, report


def _skipped(block: Block, learned: dict[str, str], why: str) -> BlockRounding:
    return BlockRounding(block.input, block.output, list(learned), 0, 0, None, None, why)


def capture_block(
    float_model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    block: Block,
    data: Iterable[Batch],
    inputs: list[InputSpec],
    calibration: CalibrationOptions,
    budget: int,
) -> BlockSample | None:
    """The block's input (``quantized``) and output (``float_model``) on the even batches (to
    fit) and the odd ones (to judge): at most :data:`BLOCK_IMAGES` images each, fewer when the
    four sets would pass ``budget`` bytes; None without a batch on either side."""
    q_run = _runner(quantized, block.input, "Q/DQ")
    f_run = _runner(float_model, block.output, "float")
    halves: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []), ([], [])]
    limit, used = BLOCK_IMAGES, 0
    for index, raw in enumerate(data):
        if calibration.max_batches is not None and index >= calibration.max_batches:
            break
        xs, ys = halves[index % 2]
        if sum(len(x) for x in xs) >= limit:
            if all(sum(len(x) for x in h[0]) >= limit for h in halves):
                break
            continue
        batch = check_batch(raw, inputs, index)
        x, y = q_run(batch, index), f_run(batch, index)
        used += 2 * (x.nbytes + y.nbytes)
        if used > budget and xs:
            limit = min(limit, sum(len(v) for v in xs))
            continue
        xs.append(x)
        ys.append(y)
    if not halves[0][0] or not halves[1][0]:
        return None
    cat = [np.concatenate(v)[:BLOCK_IMAGES].astype(np.float32) for h in halves for v in h]
    return BlockSample(*cat)


def _runner(model: onnx.ModelProto, tensor: str, what: str) -> Any:
    """A function of (batch, index) giving ``tensor`` of ``model`` on the batch (float32)."""
    if tensor in {i.name for i in model.graph.input}:
        return lambda batch, index: np.asarray(batch[tensor], dtype=np.float32)
    session = pruned_session(model, tensor, what)
    return lambda batch, index: run_session(session, tensor, batch, index)[0].astype(np.float32)


__all__ = ["BLOCK_IMAGES", "BlockRounding", "block_adaround", "capture_block"]
