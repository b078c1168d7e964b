"""GPTQ (Frantar et al., 2022): quantize a weight row by row and spread each row's rounding
error over the rows not yet quantized, along the inverse Hessian of the layer's inputs.

With ``H = X^T X`` of the layer's input ``X``, rounding row ``i`` of ``W[K, N]`` (input channel
``i``) to ``q`` and updating the later rows by ``-(w_i - q) H^-1[i, i+1:] / H^-1[i, i]`` keeps
``|X W - X Q|`` smaller than rounding every row alone.  The inverse comes as the upper Cholesky
factor of ``H^-1``; updates are applied lazily per batch of rows (one matrix product per batch).
Block scales are chosen when their first row comes up, from the already-updated rows, with the
clip search of :mod:`onnxq.numerics.blocks`; with ``act_order`` the rows go in order of
decreasing ``H[i, i]`` and the scales are fixed beforehand from the original weight.
"""

from __future__ import annotations

import numpy as np

from onnxq.numerics.blocks import (
    BlockFormat,
    BlockQuantized,
    block_params,
    codes,
)

LAZY_ROWS = 128  # rows per lazy batch update (rounded to whole blocks)


def inverse_factor(hessian: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor ``U`` of ``(H + damp * mean(diag H) I)^-1`` (``U^T U`` = inverse),
    float64.  Damping grows tenfold until the matrix is positive definite."""
    h = np.array(hessian, dtype=np.float64)
    mean = float(np.mean(np.diag(h))) or 1.0
    for attempt in range(6):
        try:
            inverse = np.linalg.inv(h + np.eye(len(h)) * damp * mean * 10**attempt)
            return np.linalg.cholesky((inverse + inverse.T) / 2).T
        except np.linalg.LinAlgError:
            continue
    return np.diag(1.0 / np.sqrt(np.maximum(np.diag(h), 1e-12) + mean))


class Factor:
    """What GPTQ needs of a Hessian, computed once for all the layers that share it: the row
    order, the rows' importance ``diag(H)`` and the inverse factor in that order."""

    def __init__(self, hessian: np.ndarray, damp: float = 0.01, act_order: bool = False):
        h = np.array(hessian, dtype=np.float64)
        self.dead = np.diag(h) <= 0
        h[self.dead, self.dead] = 1.0
        self.importance = np.diag(h).astype(np.float32)
        self.act_order = act_order
        self.order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(len(h))
        self.u = inverse_factor(h[np.ix_(self.order, self.order)], damp).astype(np.float32)


def gptq(
    w: np.ndarray,
    hessian: np.ndarray | Factor,
    fmt: BlockFormat,
    damp: float = 0.01,
    act_order: bool = False,
) -> BlockQuantized:
    """GPTQ-quantize ``w[K, N]`` for inputs whose ``X^T X`` is ``hessian[K, K]`` (or its
    :class:`Factor`, which then fixes ``damp`` and ``act_order``)."""
    f = hessian if isinstance(hessian, Factor) else Factor(hessian, damp, act_order)
    k, n = w.shape
    work = np.array(w, dtype=np.float32)
    work[f.dead] = 0.0
    rows, importance, order, u = fmt.rows(k), f.importance, f.order, f.u
    act_order = f.act_order
    scale = np.zeros((fmt.blocks(k), n), np.float32)
    zero = None if fmt.symmetric else np.zeros((fmt.blocks(k), n), np.float32)
    if act_order:  # scales fixed from the original weight
        scale, zero = block_params(work, fmt, importance)
    work = work[order]
    q = np.zeros((k, n), fmt.code_dtype)
    # every block lies inside one lazy batch, so its scale sees all earlier updates
    batch = rows * max(1, LAZY_ROWS // rows)
    per_row = BlockFormat(fmt.bits, None, fmt.symmetric)
    for i1 in range(0, k, batch):
        i2 = min(i1 + batch, k)
        part = work[i1:i2]  # a view: updates land in ``work``
        errors = np.zeros((i2 - i1, n), np.float32)
        for j in range(i2 - i1):
            i = i1 + j
            row = int(order[i])
            block = row // rows
            if not act_order and row % rows == 0:
                span = slice(j, min(j + rows, i2 - i1))
                s, z = block_params(part[span], per_row, importance[i : i + rows])
                scale[block] = s[0]
                if zero is not None and z is not None:
                    zero[block] = z[0]
            zb = None if zero is None else zero[block : block + 1]
            code = codes(part[j : j + 1], scale[block : block + 1], zb, per_row)
            q[row] = code[0]
            deq = code[0].astype(np.float32)
            if zb is not None:
                deq = deq - zb[0]
            deq *= scale[block]
            err = (part[j] - deq) / u[i, i]
            part[j + 1 :] -= np.outer(u[i, i + 1 : i2], err)
            errors[j] = err
        work[i2:] -= u[i1:i2, i2:].T @ errors
    zp = None if zero is None else zero.astype(fmt.code_dtype)
    return BlockQuantized(q, scale, zp, fmt)
