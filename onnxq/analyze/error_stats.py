"""Running sums for comparing a tensor of two models batch by batch (``onnxq analyze``): the
cosine, the SQNR and the relative error over every value, the cosine of each sample, and the
share of the error that is a per-channel offset (what bias correction removes).  Memory is a
few numbers per tensor plus one per sample and channel, never a batch of values."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ErrorSums:
    """Sums over the values finite in both models (NaN/Inf counted apart)."""

    dot: float = 0.0
    ref: float = 0.0
    got: float = 0.0
    diff: float = 0.0
    count: int = 0
    peak: float = 0.0  # largest |reference value|
    mismatches: int = 0
    samples: list[float] = field(default_factory=list)  # cosine per sample, in order
    channel_shift: np.ndarray | None = None  # per channel (axis 1): sum of got - ref
    channel_count: int = 0  # values per channel so far

    def add(self, a: np.ndarray, b: np.ndarray, samples: int) -> None:
        """Add one batch: ``a`` the reference, ``b`` the compared value; ``samples`` is the
        batch's sample count (a tensor whose leading axis has that size is split per sample).
        Sums run in float64 over the float32 values, row by row (one pass per sum); values of
        two types (a quantized model's FP16 tensor against the float model's FP32 one) are
        compared in float64, where both are exact."""
        if a.dtype != b.dtype:
            a, b = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(a) & np.isfinite(b)
        if not finite.all():
            odd = ~finite
            same = (a[odd] == b[odd]) | (np.isnan(a[odd]) & np.isnan(b[odd]))
            self.mismatches += int((~same).sum())
            a, b = np.where(finite, a, 0), np.where(finite, b, 0)
        per_sample = a.ndim >= 2 and a.shape[0] == samples > 0 and a[0].size >= 2
        rows = samples if per_sample else 1
        ra, rb = a.reshape(rows, -1), b.reshape(rows, -1)
        d = rb - ra

        def dots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return np.einsum("ij,ij->i", x, y, dtype=np.float64)

        dot, ref, got, diff = dots(ra, rb), dots(ra, ra), dots(rb, rb), dots(d, d)
        self.dot += float(dot.sum())
        self.ref += float(ref.sum())
        self.got += float(got.sum())
        self.diff += float(diff.sum())
        self.count += int(finite.sum())
        self.peak = max(self.peak, float(np.abs(a).max(initial=0.0)))
        if per_sample:
            self.samples.extend(_cosines(dot, ref, got, diff))
        if a.ndim >= 2 and a.shape[1] > 1:
            shift = np.moveaxis(d.reshape(a.shape), 1, 0).reshape(a.shape[1], -1)
            total = shift.sum(axis=1, dtype=np.float64)
            if self.channel_shift is None or self.channel_shift.shape != total.shape:
                self.channel_shift, self.channel_count = np.zeros_like(total), 0
            self.channel_shift += total
            self.channel_count += d.size // a.shape[1]

    @property
    def cosine(self) -> float:
        """Cosine similarity over all values (1.0 for two all-zero tensors)."""
        if self.ref > 0 and self.got > 0:
            return self.dot / math.sqrt(self.ref * self.got)
        return float(self.diff == 0)

    @property
    def sqnr_db(self) -> float | None:
        """Signal to quantization noise in dB (None: no error, or no signal)."""
        return sqnr_to_db(self.ref, self.diff)

    @property
    def relative_error(self) -> float:
        """||got - ref|| / ||ref|| (||got - ref|| when the reference is all zero)."""
        return math.sqrt(self.diff / self.ref) if self.ref > 0 else math.sqrt(self.diff)

    @property
    def offset_share(self) -> float:
        """The share of the error energy that is a constant offset per channel (0..1)."""
        if self.channel_shift is None or not self.channel_count or self.diff <= 0:
            return 0.0
        systematic = float(self.channel_shift @ self.channel_shift) / self.channel_count
        return min(1.0, systematic / self.diff)

    @property
    def rms(self) -> float:
        """Root mean square of the reference values."""
        return math.sqrt(self.ref / self.count) if self.count else 0.0

    def worst_samples(self, k: int = 3) -> tuple[int, ...]:
        """Indices of the ``k`` samples with the lowest cosine, worst first."""
        order = np.argsort(np.asarray(self.samples), kind="stable")
        return tuple(int(i) for i in order[:k])


def _cosines(dot: np.ndarray, ref: np.ndarray, got: np.ndarray, diff: np.ndarray) -> list[float]:
    """Cosine per row from its sums (1.0 for two all-zero rows, 0.0 for one)."""
    out = []
    for k in range(len(dot)):
        if ref[k] > 0 and got[k] > 0:
            out.append(float(dot[k] / np.sqrt(ref[k] * got[k])))
        else:
            out.append(float(diff[k] == 0))
    return out


def sqnr_to_db(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); None when there is no noise or no signal."""
    if noise <= 0 or signal <= 0:
        return None
    return 10 * math.log10(signal / noise)
