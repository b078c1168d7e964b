"""The clip ranges the output-driven range search (:mod:`onnxq.recover.rangesearch`) tries for
one activation: the current range, that range scaled, and an observer's."""

from __future__ import annotations

from dataclasses import dataclass

from onnxq.numerics.qparams import QParams, range_to_qparams


@dataclass(frozen=True)
class Candidate:
    """One range to try: ``label`` (``x1`` the current range, ``x0.8`` it scaled by 0.8,
    ``mse`` the mse observer's), ``factor`` (its high end over the current one's) and its
    qparams."""

    label: str
    factor: float
    qparams: QParams


@dataclass(frozen=True)
class Grid:
    """How a tensor's ranges become qparams: its element type, symmetry and bit width."""

    dtype: str
    symmetric: bool
    bits: int | None


def candidates(
    current: QParams,
    factors: tuple[float, ...],
    grid: Grid,
    bounds: tuple[float, float] | None,
    observed: QParams | None = None,
) -> list[Candidate]:
    """The current range first, then it scaled by each of ``factors`` (within ``bounds``,
    where the tensor's readers saturate), then ``observed`` (an observer's range); a
    candidate whose scale and zero point an earlier one already has is left out."""
    out = [Candidate("x1", 1.0, current)]
    seen = {_key(current)}
    for factor in factors:
        low, high = current.low * factor, current.high * factor
        if bounds is not None:
            low, high = max(low, bounds[0]), min(high, bounds[1])
        qp = range_to_qparams(low, high, grid.dtype, grid.symmetric, current.method, grid.bits)
        _add(out, seen, Candidate(f"x{factor:g}", _factor(qp, current), qp))
    if observed is not None:
        _add(out, seen, Candidate("mse", _factor(observed, current), observed))
    return out


def _add(out: list[Candidate], seen: set[tuple[float, int]], candidate: Candidate) -> None:
    key = _key(candidate.qparams)
    if key not in seen:
        seen.add(key)
        out.append(candidate)


def _key(qp: QParams) -> tuple[float, int]:
    return float(qp.scale), int(qp.zero_point)


def _factor(qp: QParams, current: QParams) -> float:
    """``qp``'s step over ``current``'s: how much wider its range is."""
    return float(qp.scale) / float(current.scale) if float(current.scale) > 0 else 1.0


__all__ = ["Candidate", "Grid", "candidates"]
