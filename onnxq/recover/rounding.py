"""AdaRound's optimisation for one layer: round each weight up or down so that the layer's
output error over the captured rows is least (Nagel et al., "Up or Down? Adaptive Rounding
for Post-Training Quantization", 2020).

The weight of a layer is ``s * (floor(W / s) + h)`` with ``h`` in [0, 1] per weight, a
rectified sigmoid of a free variable ``v``.  The output error over rows ``x`` is a quadratic
form of the weight error, so it is computed from the captured second moments
(:class:`onnxq.recover.capture.GramStats`) instead of the rows themselves::

    E||W_q x_q - W x_f||^2 = tr(dW H dW^T) + 2 tr(dW D^T) + c,   dW = W_q - W,
    H = E[x_q x_q^T],  D = W E[x_q (x_q - x_f)^T]^T,  c = tr(W E[(x_q - x_f)(x_q - x_f)^T] W^T)

(``x_q = x_f`` when only the float model was captured: ``D = 0``, ``c = 0``).  Each step costs
one ``[outputs, K] @ [K, K]`` product whatever the number of rows, and the gradient is the full,
exact one.  Adam moves ``v``; after a warm-up, a regulariser ``1 - |2h - 1|^beta`` with ``beta``
annealed from 20 to 2 drives every ``h`` to 0 or 1, and the result is ``floor + (h >= 0.5)``.
The output error is normalised to 1 at round-to-nearest, so the regulariser's weight means
the same in every layer.  A coordinate-descent pass (:func:`polish`) then moves single weights
to their other rounding wherever that lowers the error, starting from the better of the
learned and the nearest rounding: the result is never worse than round-to-nearest.

numpy is the reference; :func:`learn_rounding` runs the same steps in torch when asked (float32
in both; the chosen integers agree but for weights whose two roundings are within float error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxq.recover.capture import GramStats

WARMUP = 0.2  # share of the steps without the regulariser
BETA = (20.0, 2.0)  # the regulariser's exponent, annealed from the first to the second
REGULARIZATION = 5.0  # weight of the regulariser against the output error (1 at nearest)
LEARNING_RATE = 0.01
DAMPING = 0.01  # added to H's diagonal, times its mean: a direction no captured row spans
# (fewer rows than K) still counts a little, so the rounding there stays near the float weight


@dataclass(frozen=True)
class Problem:
    """One layer's rounding problem, all arrays ``[groups, outputs per group, K]`` or
    ``[groups, K, K]``: the float weight, its per-output scale (``[G, O, 1]``), the quadratic
    form of the output error (see the module docstring) and the integer limit."""

    weight: np.ndarray
    scale: np.ndarray
    h: np.ndarray
    d: np.ndarray | None
    c: float
    qmax: int

    @property
    def floor(self) -> np.ndarray:
        return np.floor(self.weight / self.scale)

    def error(self, integers: np.ndarray) -> float:
        """Mean squared output error per output value for the integer weight ``integers``."""
        delta = (np.clip(integers, -self.qmax, self.qmax) * self.scale - self.weight).astype(
            np.float64
        )
        h = self.h.astype(np.float64)
        total = float((delta * (delta @ h)).sum()) + self.c
        if self.d is not None:
            total += 2.0 * float((delta * self.d).sum())
        return max(total, 0.0) / max(self.weight.shape[0] * self.weight.shape[1], 1)

    def nearest(self) -> np.ndarray:
        """Round to nearest (half to even, as QuantizeLinear), clipped."""
        return np.clip(np.rint(self.weight / self.scale), -self.qmax, self.qmax)


def problem(
    weight: np.ndarray,
    scale: np.ndarray,
    stats: GramStats,
    qmax: int,
    fix_input_mean: bool = True,
) -> Problem:
    """The :class:`Problem` of a ``[G, O, K]`` weight with ``[G, O, 1]`` scales.

    ``fix_input_mean`` False (with the row sums captured): the target is the float output
    plus ``W E[x_q - x_f]``, the mean shift the input's error brings; the weights then take
    up the input error's fluctuation, not its mean (the cross term is a covariance)."""
    rows = max(stats.rows, 1)
    w = weight.astype(np.float64)
    h = stats.qq / rows
    diagonal = np.einsum("gkk->gk", h)
    h = h + DAMPING * diagonal.mean(axis=1)[:, None, None] * np.eye(h.shape[1])
    d = None
    c = 0.0
    if stats.qf is not None and stats.ff is not None:
        qd = (stats.qq - stats.qf) / rows  # E[x_q (x_q - x_f)^T]
        dd = (stats.qq - stats.qf - stats.qf.transpose(0, 2, 1) + stats.ff) / rows
        if not fix_input_mean and stats.q_sum is not None and stats.f_sum is not None:
            mean_q = stats.q_sum / rows
            mean_d = (stats.q_sum - stats.f_sum) / rows
            qd = qd - mean_q[:, :, None] * mean_d[:, None, :]  # Cov(x_q, x_q - x_f)
            dd = dd - mean_d[:, :, None] * mean_d[:, None, :]
        d = w @ qd.transpose(0, 2, 1)
        c = float((w * (w @ dd)).sum())
    return Problem(
        weight.astype(np.float32),
        scale.astype(np.float32),
        h.astype(np.float32),
        None if d is None else d.astype(np.float32),
        c,
        qmax,
    )


def learn_rounding(p: Problem, steps: int, use_torch: bool = False) -> np.ndarray:
    """The learned integer weight (``[G, O, K]``, float array of integers) after ``steps``
    Adam steps; torch runs the same steps when ``use_torch``."""
    if steps <= 0:
        return p.nearest()
    if use_torch:
        import torch

        with torch.no_grad():
            v = _learn(p, steps, torch, torch.from_numpy).numpy()
    else:
        v = _learn(p, steps, np, np.asarray)
    learned = np.clip(p.floor + (v >= 0.0), -p.qmax, p.qmax)
    nearest = p.nearest()
    start = learned if p.error(learned) <= p.error(nearest) else nearest
    return polish(p, start)


def polish(p: Problem, integers: np.ndarray, sweeps: int = 2) -> np.ndarray:
    """Coordinate descent from ``integers``: weight by weight, move to the other of its two
    roundings (floor or floor + 1) wherever that lowers the output error.  The error is a sum
    over output rows, so each step treats every row at once; it never rises."""
    ints = np.array(integers, dtype=np.float64)
    floor = p.floor.astype(np.float64)
    scale = p.scale.astype(np.float64)  # [G, O, 1]
    h = p.h.astype(np.float64)
    delta = np.clip(ints, -p.qmax, p.qmax) * scale - p.weight
    grad = delta @ h + (0.0 if p.d is None else p.d)  # half the gradient in the weight
    for _ in range(sweeps):
        moved = False
        for k in range(ints.shape[2]):
            target = np.where(ints[:, :, k] == floor[:, :, k], floor[:, :, k] + 1, floor[:, :, k])
            target = np.clip(target, -p.qmax, p.qmax)
            step = (target - ints[:, :, k]) * scale[:, :, 0]  # [G, O]
            change = 2.0 * step * grad[:, :, k] + step * step * h[:, k, k][:, None]
            take = (change < 0) & (step != 0)
            if not take.any():
                continue
            moved = True
            applied = np.where(take, step, 0.0)
            ints[:, :, k] = np.where(take, target, ints[:, :, k])
            grad += applied[:, :, None] * h[:, k, :][:, None, :]
        if not moved:
            break
    return ints


def _initial_v(p: Problem) -> np.ndarray:
    """``v`` whose rectified sigmoid is the fractional part of ``W / s``: the soft weight
    starts at the float weight."""
    rest = p.weight / p.scale - p.floor
    frac = np.clip((rest + 0.1) / 1.2, 1e-4, 1 - 1e-4)
    return np.log(frac / (1.0 - frac)).astype(np.float32)


def _beta(step: int, steps: int) -> float | None:
    """The regulariser's exponent at ``step`` (None during the warm-up)."""
    start = int(WARMUP * steps)
    if step < start:
        return None
    done = (step - start) / max(steps - start, 1)
    return BETA[0] + (BETA[1] - BETA[0]) * done


def _learn(p: Problem, steps: int, xp: Any, array: Any) -> Any:
    """Adam on ``v`` with the module docstring's loss; ``xp`` is numpy or torch (the same
    operations exist in both), ``array`` makes one of its arrays from a numpy array."""
    floor = array(p.floor.astype(np.float32))
    scale, weight, gram = array(p.scale), array(p.weight), array(p.h)
    d = None if p.d is None else array(p.d)
    v = array(_initial_v(p))
    m, second = xp.zeros_like(v), xp.zeros_like(v)
    # the output error is normalised to 1 at round-to-nearest, the regulariser to its mean
    norm = 1.0 / max(p.error(p.nearest()), 1e-30) / (p.weight.shape[0] * p.weight.shape[1])
    count = 1.0 / p.weight.size
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(steps):
        sig = 1.0 / (1.0 + xp.exp(-v))
        raw = sig * 1.2 - 0.1
        h = xp.clip(raw, 0.0, 1.0)
        integers = floor + h
        delta = xp.clip(integers, -p.qmax, p.qmax) * scale - weight
        grad_w = delta @ gram
        if d is not None:
            grad_w = grad_w + d
        grad_h = (2.0 * norm) * grad_w * scale * (xp.abs(integers) <= p.qmax)
        beta = _beta(step, steps)
        if beta is not None:
            centred = 2.0 * h - 1.0
            pull = xp.abs(centred) ** (beta - 1) * xp.sign(centred)
            grad_h = grad_h - (REGULARIZATION * count * beta * 2.0) * pull
        grad = grad_h * (1.2 * sig * (1.0 - sig)) * ((raw > 0.0) & (raw < 1.0))
        m = b1 * m + (1 - b1) * grad
        second = b2 * second + (1 - b2) * grad * grad
        m_hat = m / (1 - b1 ** (step + 1))
        s_hat = second / (1 - b2 ** (step + 1))
        v = v - LEARNING_RATE * m_hat / (xp.sqrt(s_hat) + eps)
    return v
