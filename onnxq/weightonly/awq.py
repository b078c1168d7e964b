"""AWQ (Lin et al., 2023): activation-aware per-input-channel scales and clipping, searched
per layer group.

The layers that read one input ``X`` are rewritten as ``(X / s) (s W)``: the float model computes
the same, but rounding ``s W`` hurts the input channels with large activations less.  With the
channels' mean magnitude ``m``, ``s = m^alpha`` (normalised so that its largest times its
smallest is 1) for the ``alpha`` on a grid with the least output error of the group's layers,
measured with the inputs' ``X^T X`` (``|X dW|^2 = tr(dW^T H dW)``, no pass over the data per
candidate).  Each block's clip is searched on the same measure (its rows weighted by the mean
square of their input), AWQ's activation-aware clipping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from onnxq.numerics.blocks import BlockFormat, BlockQuantized, quantize_rtn

ALPHAS = tuple(float(a) for a in np.linspace(0.0, 1.0, 11))
SEARCH_RATIOS = (1.0, 0.9, 0.8, 0.7)  # the clip grid while alpha is searched (coarser)
Quantizer = Callable[[np.ndarray, np.ndarray], BlockQuantized]


def channel_scales(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """``mean_abs^alpha``, normalised so that the largest times the smallest is 1 (float32)."""
    m = np.maximum(np.asarray(mean_abs, np.float64), 1e-8) ** alpha
    m = m / np.sqrt(m.max() * m.min())
    return np.clip(m, 1e-4, 1e4).astype(np.float32)


def search_scales(
    weights: Sequence[np.ndarray],
    hessian: np.ndarray,
    mean_abs: np.ndarray,
    fmt: BlockFormat,
    alphas: Sequence[float] = ALPHAS,
) -> tuple[np.ndarray, float]:
    """The input-channel scales ``s[K]`` (and their ``alpha``) with the least summed output
    error over ``weights`` (each ``[K, N_i]``) rounded with the activation-aware clip search.
    Alphas are compared with a coarse clip grid (:data:`SEARCH_RATIOS`); the winner is then
    compared with alpha 0 (``s = 1``) on the full grid, so AWQ never does worse than its
    clipping alone under this measure."""
    h32 = np.asarray(hessian, np.float32)
    diag = np.diag(h32).copy()

    def error(alpha: float, ratios: tuple[float, ...] | None) -> float:
        s = channel_scales(mean_abs, alpha)
        total = 0.0
        for w in weights:
            q = quantize_rtn(w * s[:, None], fmt, importance=diag / s**2, ratios=ratios)
            diff = q.dequantize() / s[:, None] - w
            total += float(np.einsum("ij,ij->", h32 @ diff, diff, dtype=np.float64))
        return total

    coarse = min(alphas, key=lambda a: (error(a, SEARCH_RATIOS), a))
    alpha = coarse if coarse and error(coarse, None) < error(0.0, None) else 0.0
    return channel_scales(mean_abs, alpha), alpha
