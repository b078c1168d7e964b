"""How close a quantized output is to the float one: cosines (whole, per sample, per slice),
agreement, top-1, the largest absolute error, computed in float64 in bounded slices."""

from __future__ import annotations

from typing import Any

import numpy as np


def agreement(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The share of values equal in both models (a batch whose shapes differ: none), so that
    one changed label in a batch of 32 counts 1/32, not the whole batch."""
    equal = total = 0
    for r, g in zip(ref, got, strict=True):
        if r.shape == g.shape:
            equal += int(np.count_nonzero(r == g))
            total += r.size
        else:
            total += max(r.size, g.size)
    return equal / total if total else 1.0


def sample_cosines(ref: list[np.ndarray], got: list[np.ndarray]) -> np.ndarray | None:
    """The cosine of each sample (an item along a batch's leading axis) of an output of rank
    >= 2, or None (rank < 2, shapes that differ, one value per sample, fewer than two
    samples)."""
    if any(
        r.ndim < 2 or r.shape != g.shape or r[0].size < 2 for r, g in zip(ref, got, strict=True)
    ):
        return None
    if sum(len(r) for r in ref) < 2:
        return None
    values: list[float] = []
    for r, g in zip(ref, got, strict=True):
        rows_r, rows_g = r.reshape(len(r), -1), g.reshape(len(g), -1)
        values.extend(
            cosine(a.astype(np.float64), b.astype(np.float64), overwrite=True)
            for a, b in zip(rows_r, rows_g, strict=True)
        )
    return np.asarray(values) if len(values) >= 2 else None


def cosine(a: np.ndarray, b: np.ndarray, overwrite: bool = False) -> float:
    """Cosine of two finite float64 vectors; both are divided by their common peak first, so
    that values past 1e154 (whose squares overflow) give a number, not NaN.  ``overwrite``:
    divide ``a`` and ``b`` in place (the caller's copies; no temporaries)."""
    peak = max(abs_max(a), abs_max(b))
    if peak > 0:
        if overwrite:
            a /= peak
            b /= peak
        else:
            a, b = a / peak, b / peak
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))


def flat64(arrays: list[np.ndarray]) -> np.ndarray:
    """All of ``arrays`` as one flat float64 vector, built in place (one copy)."""
    out = np.empty(sum(x.size for x in arrays), np.float64)
    at = 0
    for x in arrays:
        out[at : at + x.size] = x.ravel()
        at += x.size
    return out


_ABS_CHUNK = 1 << 20  # values per slice in abs_max (8 MB of float64)


def abs_max(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """``max |a|`` (or ``max |a - b|``) of flat vectors, 0 when empty, taken in slices so
    that no full-size temporary is made (the maximum is exact in any order)."""
    peak = 0.0
    for at in range(0, a.size, _ABS_CHUNK):
        part = (
            a[at : at + _ABS_CHUNK]
            if b is None
            else a[at : at + _ABS_CHUNK] - b[at : at + _ABS_CHUNK]
        )
        peak = max(peak, float(np.abs(part).max(initial=0.0)))
    return peak


MAX_SLICES = 128  # a slice axis has 2..MAX_SLICES entries ...
MIN_SLICE_REPEAT = 8  # ... each repeated over at least this many values per sample


DOMINATED = 2.0  # slice peak ratio from which a low slice cosine is worth a warning


def slice_axis_of(shape: tuple[int, ...]) -> int | None:
    """The axis an output of this (per-batch) shape is compared along slice by slice: of the
    axes after the first (the batch), the smallest with 2..:data:`MAX_SLICES` entries whose
    slices hold at least :data:`MIN_SLICE_REPEAT` values per sample (the first on a tie);
    None for rank < 3 or no such axis."""
    if len(shape) < 3:
        return None
    per_sample = int(np.prod(shape[1:]))
    best = None
    for axis in range(1, len(shape)):
        k = shape[axis]
        if (
            2 <= k <= MAX_SLICES
            and per_sample >= MIN_SLICE_REPEAT * k
            and (best is None or k < shape[best])
        ):
            best = axis
    return best


def slice_cosines(
    ref: list[np.ndarray], got: list[np.ndarray]
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(axis, cosine of every slice along it over all batches, each slice's peak |x| in the
    float model), or None when the outputs have no slice axis or their shapes disagree between
    batches or models."""
    axis = slice_axis_of(ref[0].shape)
    if axis is None:
        return None
    k = ref[0].shape[axis]
    if any(
        r.shape != g.shape or r.ndim != ref[0].ndim or r.shape[axis] != k
        for r, g in zip(ref, got, strict=True)
    ):
        return None
    # one scale for every batch (as in cosine: squares of values past 1e154 overflow)
    scale = max((float(np.abs(x).max(initial=0.0)) for x in (*ref, *got)), default=0.0) or 1.0
    dot, na, nb, peaks = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    for r, g in zip(ref, got, strict=True):
        rm = np.moveaxis(r, axis, 0).reshape(k, -1).astype(np.float64)
        gm = np.moveaxis(g, axis, 0).reshape(k, -1).astype(np.float64)
        if rm.size:
            peaks = np.maximum(peaks, np.abs(rm).max(axis=1))
        rm, gm = rm / scale, gm / scale
        dot += np.einsum("ij,ij->i", rm, gm)
        na += np.einsum("ij,ij->i", rm, rm)
        nb += np.einsum("ij,ij->i", gm, gm)
    cosines = np.ones(k)
    denom = np.sqrt(na * nb)
    positive = denom > 0
    cosines[positive] = dot[positive] / denom[positive]
    # an all-zero slice: 1 when both models give zeros there, else 0
    cosines[~positive] = ((na == 0) & (nb == 0))[~positive].astype(np.float64)
    return axis, cosines, peaks


def top1(ref: list[np.ndarray], got: list[np.ndarray], axis: int | None) -> float | None:
    """The share of rows along ``axis`` whose argmax agrees (None: no axis, or shapes that do
    not allow it)."""
    if axis is None:
        return None
    same: list[np.ndarray] = []
    for r, g in zip(ref, got, strict=True):
        if r.shape != g.shape or not r.ndim or not -r.ndim <= axis < r.ndim or r.size == 0:
            return None
        same.append((np.argmax(r, axis=axis) == np.argmax(g, axis=axis)).ravel())
    return round(float(np.concatenate(same).mean()), 6) if same else None


def as_array(value: Any) -> np.ndarray | None:
    """A numeric array for an output: tensors as they are, a sequence of {key: number} maps
    (scikit-learn's ZipMap probabilities) as rows of its values in key order; None for any
    other output."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biuf" else None
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = sorted(value[0])
        try:
            return np.array([[float(v[k]) for k in keys] for v in value], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            return None
    return None
