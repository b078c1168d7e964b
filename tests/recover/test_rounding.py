"""AdaRound's optimisation: its quadratic form is the layer's output error, the learned
rounding beats round-to-nearest, numpy and torch choose the same integers."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.recover import rounding
from onnxq.recover.capture import GramStats


def correlated_problem(
    seed: int = 0, groups: int = 1, outputs: int = 8, k: int = 24, rows: int = 512
):
    r = np.random.default_rng(seed)
    mix = r.standard_normal((groups, k, k))
    x = r.standard_normal((groups, rows, k)) @ mix  # correlated inputs, as image patches are
    w = r.standard_normal((groups, outputs, k)).astype(np.float32) * 0.1
    scale = (np.abs(w).max(axis=2, keepdims=True) / 127).astype(np.float32)
    stats = GramStats(x.transpose(0, 2, 1) @ x, rows=rows)
    return rounding.problem(w, scale, stats, 127), x, w, scale


def test_the_quadratic_form_is_the_mean_squared_output_error():
    p, x, w, scale = correlated_problem(groups=2)
    ints = p.nearest()
    direct = np.mean((x @ (ints * scale - w).transpose(0, 2, 1)) ** 2)
    damped = p.error(ints)
    assert damped == pytest.approx(direct, rel=0.02)  # the 1% damping of H's diagonal


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learned_rounding_beats_nearest_by_a_margin(seed):
    p, *_ = correlated_problem(seed)
    learned = rounding.learn_rounding(p, 600)
    assert p.error(learned) < 0.7 * p.error(p.nearest())
    floor = p.floor
    assert np.all((learned == floor) | (learned == floor + 1))  # at most one step away


def test_zero_steps_is_round_to_nearest():
    p, *_ = correlated_problem()
    np.testing.assert_array_equal(rounding.learn_rounding(p, 0), p.nearest())


def test_torch_chooses_the_same_integers_as_numpy():
    pytest.importorskip("torch")
    p, *_ = correlated_problem(groups=3)
    a = rounding.learn_rounding(p, 400, use_torch=False)
    b = rounding.learn_rounding(p, 400, use_torch=True)
    assert (a == b).mean() > 0.99
    assert p.error(b) == pytest.approx(p.error(a), rel=0.02)


def asymmetric_problem(fix_input_mean: bool, seed: int = 3, rows: int = 2048):
    """A layer whose quantized input is its float input plus a shift and noise."""
    _, x_f, w, scale = correlated_problem(seed, groups=2, rows=rows)
    r = np.random.default_rng(seed + 10)
    x_q = x_f + 0.3 + 0.2 * r.standard_normal(x_f.shape)
    q, f = x_q.transpose(0, 2, 1), x_f.transpose(0, 2, 1)
    stats = GramStats(q @ x_q, q @ x_f, f @ x_f, rows, x_q.sum(axis=1), x_f.sum(axis=1))
    return rounding.problem(w, scale, stats, 127, fix_input_mean), x_q, x_f, w, scale


@pytest.mark.parametrize("fix_input_mean", [True, False])
def test_the_asymmetric_form_is_the_error_against_the_float_output(fix_input_mean):
    p, x_q, x_f, w, scale = asymmetric_problem(fix_input_mean)
    ints = p.nearest()
    target = x_f @ w.transpose(0, 2, 1)
    if not fix_input_mean:  # the input error's mean shift, passed through, is part of the target
        target = target + (x_q - x_f).mean(axis=1, keepdims=True) @ w.transpose(0, 2, 1)
    direct = np.mean((x_q @ (ints * scale).transpose(0, 2, 1) - target) ** 2)
    assert p.error(ints) == pytest.approx(direct, rel=0.02)


def test_learned_rounding_takes_up_part_of_the_input_error():
    p, *_ = asymmetric_problem(True)
    learned = rounding.learn_rounding(p, 400)
    assert p.error(learned) < p.error(p.nearest())
