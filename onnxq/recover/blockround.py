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
block forward and back on :data:`BATCH_IMAGES` images of a sample (at most
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
from onnxq.data import check_batch
from onnxq.inputs import Batch, InputSpec
from onnxq.options import CalibrationOptions, RecoveryOptions, WeightOptions
from onnxq.place.annotations import Annotations
from onnxq.progress import counted
from onnxq.qparams import QParams
from onnxq.recover.adaround import ChosenWeight, RoundingTarget, rounding_targets
from onnxq.recover.blockprogram import BlockProgram, block_program
from onnxq.recover.blocks import Block, find_blocks
from onnxq.recover.convengine import NumpyConv, conv_engine
from onnxq.recover.outputs import OutputError, pruned_session, run_session
from onnxq.recover.rounding import BETA, LEARNING_RATE, REGULARIZATION, WARMUP

BLOCK_IMAGES = 32  # images of the even batches a block is fitted on (as many judge it)
BATCH_IMAGES = 4  # images per optimisation step
SEED = 0


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
    from onnxq.materialize import materialize

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
    judge = OutputError(model, data, inputs, calibration.max_batches, budget, every=(2, 1))
    engine = conv_engine(options.adaround_engine)
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


@dataclass
class BlockSample:
    """A block's input in the quantized model and output in the float model, for the images
    it is fitted on and for those it is judged on."""

    fit_x: np.ndarray
    fit_y: np.ndarray
    judge_x: np.ndarray
    judge_y: np.ndarray


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


@dataclass
class SoftWeight:
    """One learned layer's rounding variables (engine arrays, the Conv weight's shape)."""

    floor: Any
    scale: Any
    qmax: int
    v: Any
    m: Any
    s: Any
    nearest: np.ndarray

    def hard(self, engine: NumpyConv) -> np.ndarray:
        """The integers of the current rounding (``h >= 0.5``)."""
        up = engine.numpy(self.v) >= 0.0
        return np.clip(engine.numpy(self.floor) + up, -self.qmax, self.qmax)


def learn_block(
    program: BlockProgram,
    graph: ir.Graph,
    targets: dict[str, RoundingTarget],
    sample: BlockSample,
    engine: NumpyConv,
    steps: int,
) -> tuple[dict[str, ChosenWeight], tuple[int, int, float, float, str, float]]:
    """The learned integers of ``program``'s layers (by weight tensor, only when better than
    round-to-nearest on the judged images) and the report fields after the layer names."""
    soft = {w: _soft(graph, targets[w], engine) for w in program.learned}
    x, y = engine.array(sample.fit_x), engine.array(sample.fit_y)
    nearest = {w: engine.array(sw.nearest * _np(engine, sw.scale)) for w, sw in soft.items()}
    norm = 1.0 / max(block_mse(program, engine, x, y, nearest), 1e-30)
    rng = np.random.default_rng(SEED)
    count = sum(int(sw.nearest.size) for sw in soft.values())
    for step in range(steps):
        take = np.sort(rng.choice(len(sample.fit_x), min(BATCH_IMAGES, len(sample.fit_x)), False))
        _adam_step(
            program, engine, soft, x[take.tolist()], y[take.tolist()], norm, count, step, steps
        )
    hard = {w: sw.hard(engine) for w, sw in soft.items()}
    jx, jy = engine.array(sample.judge_x), engine.array(sample.judge_y)
    scaled = {w: engine.array(hard[w] * _np(engine, soft[w].scale)) for w in soft}
    mse_nearest = block_mse(program, engine, jx, jy, nearest)
    mse_learned = block_mse(program, engine, jx, jy, scaled)
    better = mse_learned < mse_nearest
    changed = sum(int((hard[w] != soft[w].nearest).sum()) for w in soft) / max(count, 1)
    found = {
        w: ChosenWeight(targets[w].qparams, hard[w].astype(np.int8)) for w in soft
    } if better else {}  # fmt: skip
    kept = "learned" if better else "nearest"
    return found, (len(sample.fit_x), steps, mse_nearest, mse_learned, kept, changed)


def _np(engine: NumpyConv, value: Any) -> np.ndarray:
    return engine.numpy(value)


def _soft(graph: ir.Graph, target: RoundingTarget, engine: NumpyConv) -> SoftWeight:
    weight = graph.const_value(target.layer.weight)
    assert weight is not None
    shape = (-1,) + (1,) * (weight.ndim - 1)
    scale = np.broadcast_to(
        np.asarray(target.qparams.scale, np.float32).reshape(-1), (weight.shape[0],)
    )
    scale = scale.reshape(shape).astype(np.float32)
    ratio = weight.astype(np.float32) / scale
    floor = np.floor(ratio)
    frac = np.clip((ratio - floor + 0.1) / 1.2, 1e-4, 1 - 1e-4)
    v = np.log(frac / (1.0 - frac)).astype(np.float32)
    nearest = np.clip(np.rint(ratio), -target.qmax, target.qmax)
    zeros = np.zeros_like(v)
    return SoftWeight(
        engine.array(floor), engine.array(scale), target.qmax, engine.array(v),
        engine.array(zeros), engine.array(zeros), nearest,
    )  # fmt: skip


def block_mse(
    program: BlockProgram, engine: NumpyConv, x: Any, y: Any, weights: dict[str, Any]
) -> float:
    """Mean squared difference between the block's output for ``x`` and ``y``, in chunks."""
    total, size = 0.0, 0
    for start in range(0, len(x), BATCH_IMAGES):
        out, _ = program.forward(engine, x[start : start + BATCH_IMAGES], weights)
        diff = _np(engine, out - y[start : start + BATCH_IMAGES]).astype(np.float64)
        total += float(np.square(diff).sum())
        size += diff.size
    return total / max(size, 1)


def _adam_step(
    program: BlockProgram,
    engine: NumpyConv,
    soft: dict[str, SoftWeight],
    x: Any,
    y: Any,
    norm: float,
    count: int,
    step: int,
    steps: int,
) -> None:
    """One Adam step on every soft weight's ``v`` for the images ``x`` (targets ``y``)."""
    xp = engine.xp
    parts = {}
    for w, sw in soft.items():
        sig = 1.0 / (1.0 + xp.exp(-sw.v))
        raw = sig * 1.2 - 0.1
        ints = sw.floor + xp.clip(raw, 0.0, 1.0)
        parts[w] = (sig, raw, ints)
    weights = {
        w: xp.clip(p[2], -soft[w].qmax, soft[w].qmax) * soft[w].scale for w, p in parts.items()
    }
    out, values = program.forward(engine, x, weights)
    size = 1
    for d in out.shape:
        size *= int(d)
    grads = program.backward(engine, (out - y) * (2.0 * norm / size), values, weights)
    start = int(WARMUP * steps)
    beta = (
        None
        if step < start
        else BETA[0] + (BETA[1] - BETA[0]) * (step - start) / max(steps - start, 1)
    )
    b1, b2, eps = 0.9, 0.999, 1e-8
    for w, sw in soft.items():
        sig, raw, ints = parts[w]
        grad_h = grads[w] * sw.scale * (xp.abs(ints) <= sw.qmax)
        if beta is not None:
            centred = 2.0 * xp.clip(raw, 0.0, 1.0) - 1.0
            pull = xp.abs(centred) ** (beta - 1) * xp.sign(centred)
            grad_h = grad_h - (REGULARIZATION / count * beta * 2.0) * pull
        grad = grad_h * (1.2 * sig * (1.0 - sig)) * ((raw > 0.0) & (raw < 1.0))
        sw.m = b1 * sw.m + (1 - b1) * grad
        sw.s = b2 * sw.s + (1 - b2) * grad * grad
        m_hat = sw.m / (1 - b1 ** (step + 1))
        s_hat = sw.s / (1 - b2 ** (step + 1))
        sw.v = sw.v - LEARNING_RATE * m_hat / (xp.sqrt(s_hat) + eps)


__all__ = [
    "BlockRounding",
    "BlockSample",
    "block_adaround",
    "block_mse",
    "capture_block",
    "learn_block",
]
