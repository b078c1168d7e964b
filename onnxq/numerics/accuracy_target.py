"""An accuracy target (``--target cosine=0.999``): a metric over the float and the quantized
model's outputs on held-out batches, and the threshold it must reach.

A metric is any callable ``metric(reference, quantized) -> float`` over two lists (one item per
held-out batch) of ``{output_name: np.ndarray}``; higher is better.  The built-in ones, by name
(:data:`METRICS`), take the worst output of the model:

* ``cosine``: the cosine similarity of all values of an output over all held-out batches (the
  report's fidelity cosine);
* ``sample_cosine``: the worst single sample's cosine (what a user sees on a bad input);
* ``sqnr``: signal-to-quantization-noise ratio in dB, ``10 log10(sum x^2 / sum (x - q)^2)``;
* ``top1``: the share of rows whose largest entry along the last axis is the float model's
  (outputs of rank >= 2 with at least two entries on that axis: class scores or logits).

Outputs that are not float tensors are left out of every built-in metric, and the built-in
metrics see outputs without the rows a padding mask marks as padding (:func:`without_padding`):
what the float model computes for a padded token is read by nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxq.errors import ConfigError

Outputs = list[dict[str, np.ndarray]]
Metric = Callable[[Outputs, Outputs], float]


def _float_pairs(reference: Outputs, quantized: Outputs) -> dict[str, tuple[np.ndarray, ...]]:
    """Output name -> (float values, quantized values), float64 and flattened per batch, for
    every output that is a float tensor in every batch."""
    pairs: dict[str, tuple[np.ndarray, ...]] = {}
    for name in sorted(reference[0]) if reference else []:
        ref = [np.asarray(r[name]) for r in reference]
        got = [np.asarray(q[name]) for q in quantized]
        if all(a.dtype.kind == "f" and a.shape == b.shape for a, b in zip(ref, got, strict=True)):
            pairs[name] = (
                np.concatenate([a.astype(np.float64).ravel() for a in ref]),
                np.concatenate([b.astype(np.float64).ravel() for b in got]),
            )
    return pairs


def _cosine_of(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def cosine(reference: Outputs, quantized: Outputs) -> float:
    """The lowest cosine similarity of a float output (all its values over all batches)."""
    pairs = _float_pairs(reference, quantized)
    return min((_cosine_of(a, b) for a, b in pairs.values()), default=1.0)


def sample_cosine(reference: Outputs, quantized: Outputs) -> float:
    """The lowest cosine similarity of one sample (an item along a batch's first axis) of a
    float output of rank >= 2."""
    worst = 1.0
    for r, q in zip(reference, quantized, strict=True):
        for name in r:
            a, b = np.asarray(r[name]), np.asarray(q[name])
            if a.dtype.kind != "f" or a.ndim < 2 or a.shape != b.shape:
                continue
            rows_a = a.reshape(len(a), -1).astype(np.float64)
            rows_b = b.reshape(len(b), -1).astype(np.float64)
            for x, y in zip(rows_a, rows_b, strict=True):
                worst = min(worst, _cosine_of(x, y))
    return worst


def sqnr(reference: Outputs, quantized: Outputs) -> float:
    """The lowest signal-to-quantization-noise ratio of a float output, in dB (inf: equal)."""
    worst = math.inf
    for a, b in _float_pairs(reference, quantized).values():
        keep = np.isfinite(a) & np.isfinite(b)
        noise = float(np.sum((a[keep] - b[keep]) ** 2))
        signal = float(np.sum(a[keep] ** 2))
        if noise > 0:
            worst = min(worst, 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf)
    return worst


def top1(reference: Outputs, quantized: Outputs) -> float:
    """The lowest share of rows (along the last axis) whose argmax is the float model's, over
    float outputs of rank >= 2 with at least two entries on the last axis."""
    agree: dict[str, list[int]] = {}
    for r, q in zip(reference, quantized, strict=True):
        for name in r:
            a, b = np.asarray(r[name]), np.asarray(q[name])
            if a.dtype.kind != "f" or a.ndim < 2 or a.shape[-1] < 2 or a.shape != b.shape:
                continue
            same = np.argmax(a, axis=-1) == np.argmax(b, axis=-1)
            counts = agree.setdefault(name, [0, 0])
            counts[0] += int(same.sum())
            counts[1] += same.size
    if not agree:
        raise ConfigError(
            "target metric top1: no output of the model holds class scores (a float output "
            "of rank >= 2 with two or more entries on its last axis); use cosine, "
            "sample_cosine or sqnr"
        )
    return min(hit / total for hit, total in agree.values())


def without_padding(outputs: Outputs, masks: list[np.ndarray | None]) -> Outputs:
    """``outputs`` (one dict per batch) without padded rows: an output of rank >= 3 whose two
    leading axes are its batch's padding mask (``onnxq.backends.runs.padding_masks``:
    [batch, sequence], False = padding) keeps the unpadded rows only, as [rows, ...]."""
    out = []
    for batch, mask in zip(outputs, masks, strict=True):
        kept = {}
        for name, value in batch.items():
            array = np.asarray(value)
            fits = mask is not None and array.ndim >= 3 and array.shape[:2] == mask.shape
            kept[name] = array[mask] if fits else value
        out.append(kept)
    return out


METRICS: dict[str, Metric] = {
    "cosine": cosine,
    "sample_cosine": sample_cosine,
    "sqnr": sqnr,
    "top1": top1,
}


@dataclass(frozen=True)
class AccuracyTarget:
    """A metric (a name from :data:`METRICS`, or a callable ``metric(reference, quantized)``
    over held-out outputs, higher is better) and the value it must reach.  ``name`` is how
    reports call a callable metric; ``heldout``: the data to measure it on (any calibration
    source; None: the first ``heldout_batches`` batches of the calibration data)."""

    metric: str | Metric
    threshold: float
    name: str = ""
    heldout: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.metric, str) and self.metric not in METRICS:
            raise ConfigError(
                f"unknown target metric {self.metric!r}; valid: {', '.join(METRICS)}, or a "
                "callable metric(reference, quantized) -> float in the Python API"
            )
        if not callable(self.metric) and not isinstance(self.metric, str):
            raise ConfigError(f"target metric must be a name or a callable, got {self.metric!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            raise ConfigError(f"target threshold must be a number, got {self.threshold!r}")
        if not self.name:
            label = self.metric if isinstance(self.metric, str) else _callable_name(self.metric)
            object.__setattr__(self, "name", label)

    def evaluate(
        self,
        reference: Outputs,
        quantized: Outputs,
        masks: list[np.ndarray | None] | None = None,
    ) -> float:
        """The metric's value for ``quantized`` against ``reference``; a built-in metric
        leaves out the rows ``masks`` (one padding mask or None per batch) mark as padding,
        a callable gets the outputs as the models gave them."""
        if isinstance(self.metric, str):
            if masks is not None:
                reference = without_padding(reference, masks)
                quantized = without_padding(quantized, masks)
            value = METRICS[self.metric](reference, quantized)
        else:
            value = self.metric(reference, quantized)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
            raise ConfigError(
                f"target metric {self.name} returned {value!r}; it must return a number "
                "(higher is better)"
            )
        return float(value)

    def met(self, value: float) -> bool:
        """True if ``value`` reaches the threshold."""
        return value >= self.threshold

    def describe(self) -> str:
        """``cosine >= 0.999``."""
        return f"{self.name} >= {self.threshold:g}"


def _callable_name(fn: Metric) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def parse_target(text: str, where: str = "--target") -> AccuracyTarget:
    """An :class:`AccuracyTarget` from ``METRIC=VALUE`` (``cosine=0.999``, ``sqnr=30``)."""
    metric, sep, value = str(text).partition("=")
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not sep or not metric.strip() or not math.isfinite(threshold):
        raise ConfigError(
            f"{where} {text!r}: expected METRIC=VALUE, e.g. cosine=0.999 (metrics: "
            f"{', '.join(METRICS)})"
        )
    if metric.strip() not in METRICS:
        raise ConfigError(
            f"{where} {text!r}: unknown metric {metric.strip()!r}; valid: {', '.join(METRICS)}"
        )
    return AccuracyTarget(metric.strip(), threshold)


__all__ = ["METRICS", "AccuracyTarget", "Metric", "Outputs", "parse_target", "without_padding"]
