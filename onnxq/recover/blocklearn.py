"""Block reconstruction's optimisation: the soft roundings of a block's layers moved together
by Adam against the block's float output (:mod:`onnxq.recover.blockround` runs it block by
block).

Each learned Conv's weight is AdaRound's ``s * clip(floor(W / s) + h(v), -qmax, qmax)``
(:mod:`onnxq.recover.rounding`: the same rectified sigmoid, regulariser, warm-up and ``beta``
schedule); the loss is the block's output MSE, normalised to 1 at round-to-nearest, plus
``REGULARIZATION`` times the regulariser's mean over the block's weights.  Every step runs the
block (:class:`onnxq.recover.blockprogram.BlockProgram`) forward and back on
:data:`BATCH_IMAGES` images drawn with a fixed seed, so the same inputs give the same integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxq import ir
from onnxq.recover.adaround import ChosenWeight, RoundingTarget
from onnxq.recover.blockprogram import BlockProgram
from onnxq.recover.convengine import NumpyConv
from onnxq.recover.rounding import BETA, LEARNING_RATE, REGULARIZATION, WARMUP

BATCH_IMAGES = 4  # images per optimisation step
SEED = 0


@dataclass
class BlockSample:
    """A block's input in the quantized model and output in the float model, for the images
    it is fitted on and for those it is judged on."""

    fit_x: np.ndarray
    fit_y: np.ndarray
    judge_x: np.ndarray
    judge_y: np.ndarray


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


__all__ = ["BATCH_IMAGES", "BlockSample", "SoftWeight", "block_mse", "learn_block"]
