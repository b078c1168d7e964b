"""Block-wise integer weights: the format, round-to-nearest with a clip search, dequantization.

A weight is handled as ``W[K, N]`` (K inputs, N outputs: a MatMul's right-hand side).  Blocks run
along K: rows ``b*B .. b*B+B-1`` of one output column share a scale (and, asymmetric, a zero
point).  ``block_size=None`` means one block over all of K: a scale per output channel.  When
``B`` does not divide ``K`` the last block is shorter (the writers pad it with zeros).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# clip ratios tried per block: the scale is ratio x (largest magnitude / qmax)
CLIP_RATIOS = tuple(float(r) for r in np.linspace(1.0, 0.5, 21))
CHUNK_BYTES = 16 * 2**20  # float32 columns handled at once by quantize_rtn


@dataclass(frozen=True)
class BlockFormat:
    """How one weight is stored: ``bits`` (4 or 8), ``block_size`` along K (None: per output
    channel) and ``symmetric`` (zero point fixed: codes -2^(b-1) .. 2^(b-1)-1) or not (codes
    0 .. 2^b-1 with an integer zero point per block)."""

    bits: int
    block_size: int | None
    symmetric: bool

    @property
    def qmin(self) -> int:
        """Smallest integer code."""
        return -(2 ** (self.bits - 1)) if self.symmetric else 0

    @property
    def qmax(self) -> int:
        """Largest integer code."""
        return 2 ** (self.bits - 1) - 1 if self.symmetric else 2**self.bits - 1

    @property
    def code_dtype(self) -> type[np.integer]:  # type: ignore[type-arg]
        """The numpy type that holds the codes: int8 (symmetric) or uint8."""
        return np.int8 if self.symmetric else np.uint8

    def rows(self, k: int) -> int:
        """Rows per block for a weight with ``k`` input rows."""
        return k if self.block_size is None else self.block_size

    def blocks(self, k: int) -> int:
        """Number of blocks along K."""
        return -(-k // self.rows(k))

    def describe(self) -> str:
        """E.g. ``int4 sym block 32`` or ``int8 sym per-channel``."""
        where = "per-channel" if self.block_size is None else f"block {self.block_size}"
        return f"int{self.bits} {'sym' if self.symmetric else 'asym'} {where}"


@dataclass
class BlockQuantized:
    """Integer codes ``q[K, N]`` (int8, or uint8 when asymmetric: one byte per weight),
    ``scale[blocks, N]`` (float32) and, asymmetric, ``zero_point[blocks, N]`` (codes)."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None
    fmt: BlockFormat

    def dequantize(self) -> np.ndarray:
        """The float weight ``W[K, N]`` that the codes stand for (float32)."""
        k, n = self.q.shape
        rows = self.fmt.rows(k)
        out = np.empty((k, n), np.float32)
        for b in range(self.fmt.blocks(k)):
            span = slice(b * rows, min((b + 1) * rows, k))
            codes = self.q[span].astype(np.float32)
            if self.zero_point is not None:
                codes -= self.zero_point[b].astype(np.float32)
            out[span] = codes * self.scale[b]
        return out


def to_blocks(w: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """``w[K, N]`` as ``[blocks, rows, N]``, the last block padded with zeros."""
    k, n = w.shape
    rows, nb = fmt.rows(k), fmt.blocks(k)
    if nb * rows != k:
        w = np.concatenate([w, np.zeros((nb * rows - k, n), dtype=w.dtype)])
    return w.reshape(nb, rows, n)


def block_params(
    w: np.ndarray,
    fmt: BlockFormat,
    importance: np.ndarray | None = None,
    ratios: tuple[float, ...] = CLIP_RATIOS,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scale (and zero point) per block of ``w[K, N]``: of the clip ``ratios``, per block and
    column the one with the least squared rounding error, each row weighted by
    ``importance[K]`` (e.g. the mean square of its input; None: all rows alike).  Columns are
    searched in slices of about :data:`CHUNK_BYTES` of float32 (each column's choice is its
    own), so that the search of a large weight (an LM head) needs little memory."""
    k, n = w.shape
    step = max(1, CHUNK_BYTES // (4 * k))
    if n <= step:
        return _block_params(w, fmt, importance, ratios)
    parts = [_block_params(w[:, c : c + step], fmt, importance, ratios) for c in range(0, n, step)]
    scale = np.concatenate([s for s, _ in parts], axis=1)
    zeros = [z for _, z in parts if z is not None]
    return scale, (np.concatenate(zeros, axis=1) if zeros else None)


def _block_params(
    w: np.ndarray,
    fmt: BlockFormat,
    importance: np.ndarray | None,
    ratios: tuple[float, ...],
) -> tuple[np.ndarray, np.ndarray | None]:
    blocks = to_blocks(np.asarray(w, dtype=np.float32), fmt)  # [nb, rows, N]
    weight = None
    if importance is not None:
        weight = to_blocks(np.asarray(importance, np.float32)[:, None], fmt)  # [nb, rows, 1]
    if fmt.symmetric:
        peak = np.abs(blocks).max(axis=1)
        lo = hi = peak
    else:
        lo = np.minimum(blocks.min(axis=1), 0.0)
        hi = np.maximum(blocks.max(axis=1), 0.0)
    best_err = np.full(lo.shape, np.inf, np.float32)
    best_scale = np.zeros_like(best_err)
    best_zero = np.zeros_like(best_err) if not fmt.symmetric else None
    work = np.empty_like(blocks)  # one buffer for every ratio's squared error
    for ratio in ratios:
        scale, zero = _candidate(lo, hi, ratio, fmt)
        err = _squared_error(blocks, scale, zero, weight, fmt, work)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        if best_zero is not None and zero is not None:
            best_zero = np.where(better, zero, best_zero)
    return best_scale.astype(np.float32), best_zero


def _candidate(
    lo: np.ndarray, hi: np.ndarray, ratio: float, fmt: BlockFormat
) -> tuple[np.ndarray, np.ndarray | None]:
    tiny = np.float32(1e-12)
    if fmt.symmetric:
        return np.maximum(hi * ratio / fmt.qmax, tiny).astype(np.float32), None
    scale = np.maximum((hi - lo) * ratio / (fmt.qmax - fmt.qmin), tiny).astype(np.float32)
    zero = np.clip(np.rint(-lo * ratio / scale), fmt.qmin, fmt.qmax).astype(np.float32)
    return scale, zero


def _squared_error(
    blocks: np.ndarray,
    scale: np.ndarray,
    zero: np.ndarray | None,
    weight: np.ndarray | None,
    fmt: BlockFormat,
    work: np.ndarray,
) -> np.ndarray:
    """Per block and column, the (row-weighted) sum of squared rounding errors of ``blocks``
    ``[nb, rows, N]`` for ``scale``/``zero`` ``[nb, N]``, computed in ``work`` (its shape):
    the same operations as fake-quantizing, subtracting and squaring, without temporaries."""
    s = scale[:, None]
    np.divide(blocks, s, out=work)
    np.rint(work, out=work)
    if zero is not None:
        work += zero[:, None]
    np.clip(work, fmt.qmin, fmt.qmax, out=work)
    if zero is not None:
        work -= zero[:, None]
    work *= s
    work -= blocks
    np.square(work, out=work)
    if weight is not None:
        work *= weight
    return work.sum(axis=1)


def codes(
    w: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, fmt: BlockFormat
) -> np.ndarray:
    """Integer codes of ``w[K, N]`` for per-block ``scale`` (and ``zero``)."""
    k = w.shape[0]
    rows = fmt.rows(k)
    s = np.repeat(scale, rows, axis=0)[:k]
    q = np.rint(w / s)
    if zero is not None:
        q = q + np.repeat(zero, rows, axis=0)[:k]
    return np.clip(q, fmt.qmin, fmt.qmax).astype(fmt.code_dtype)


def quantize_rtn(
    w: np.ndarray,
    fmt: BlockFormat,
    importance: np.ndarray | None = None,
    clip: bool = True,
    ratios: tuple[float, ...] | None = None,
) -> BlockQuantized:
    """Round to nearest per block, with the error-minimising clip search over ``ratios``
    (default :data:`CLIP_RATIOS`) unless ``clip`` is False (then the block's full range).
    Columns are handled in slices of about :data:`CHUNK_BYTES` of float32, so that a large
    weight (an LM head) needs little more memory than its codes."""
    w = np.asarray(w, np.float32)
    k, n = w.shape
    q = np.empty((k, n), fmt.code_dtype)
    scale = np.empty((fmt.blocks(k), n), np.float32)
    zero = None if fmt.symmetric else np.empty((fmt.blocks(k), n), fmt.code_dtype)
    step = max(1, CHUNK_BYTES // (4 * k))
    for c in range(0, n, step):
        part = w[:, c : c + step]
        s, z = block_params(part, fmt, importance, (ratios or CLIP_RATIOS) if clip else (1.0,))
        q[:, c : c + step] = codes(part, s, z, fmt)
        scale[:, c : c + step] = s
        if zero is not None and z is not None:
            zero[:, c : c + step] = z
    return BlockQuantized(q, scale, zero, fmt)


def output_error(w: np.ndarray, deq: np.ndarray, hessian: np.ndarray | None) -> float:
    """Relative error of the layer's output: ``|X dW|^2 / |X W|^2`` from ``hessian = X^T X``
    (without one: of the weight itself).  Columns are taken in slices (float32 products
    summed in float64), so a large weight needs little memory beyond itself."""
    k, n = w.shape
    h = None if hessian is None else np.asarray(hessian, np.float32)
    num = den = 0.0
    step = max(1, CHUNK_BYTES // (4 * k))
    for c in range(0, n, step):
        ref = np.asarray(w[:, c : c + step], np.float32)
        diff = np.asarray(deq[:, c : c + step], np.float32) - ref
        if h is None:
            num += float(np.sum(diff.astype(np.float64) ** 2))
            den += float(np.sum(ref.astype(np.float64) ** 2))
        else:
            num += float(np.einsum("ij,ij->", h @ diff, diff, dtype=np.float64))
            den += float(np.einsum("ij,ij->", h @ ref, ref, dtype=np.float64))
    return num / max(den, 1e-30)
