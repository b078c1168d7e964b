"""The data-driven exclusions: decisions that need the calibration data, as an ordered tuple of
values like the rules.

Each exclusion has a name, the :class:`~onnxq.config.options.PlacementOptions` field that holds its
threshold, and a check that returns the reason a tensor or a quantized node stays float, or
None.  :func:`find_exclusions` runs them in order over one placement and its statistics (a
later exclusion's reason wins for a node two of them name).  To add one: write its check, add
the value to :data:`EXCLUSIONS`, and declare its option (QuantConfig, PlacementOptions,
``docs/config.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from onnxq.config.placement import PlacementOptions
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.annotations import Annotations, Decision, Excluded, TensorAnnotation
from onnxq.place.facts import GraphFacts
from onnxq.place.rules.weighted import WEAK_SHARE


@dataclass(frozen=True)
class Evidence:
    """What the checks read: the statistics of the observed tensors and the graph facts."""

    stats: Mapping[str, TensorStats]
    facts: GraphFacts


@dataclass(frozen=True)
class TensorExclusion:
    """Keeps an activation tensor float: ``check(tensor, threshold, evidence)``."""

    name: str
    option: str
    check: Callable[[TensorAnnotation, float, Evidence], str | None]


@dataclass(frozen=True)
class NodeExclusion:
    """Keeps a node that a rule quantized float: ``check(decision, threshold, evidence)``."""

    name: str
    option: str
    check: Callable[[Decision, float, Evidence], str | None]


def _peak(stats: TensorStats) -> float:
    return max(abs(stats.min), abs(stats.max))


def _mask_range(ann: TensorAnnotation, max_abs: float, evidence: Evidence) -> str | None:
    """A tensor whose magnitude reaches ``max_abs``: an additive attention mask filled with -1e4
    or -3.4e38, or any range so wide that int8 would wipe out its ordinary values."""
    s = evidence.stats.get(ann.tensor)
    if s is None or s.count == 0 or _peak(s) < max_abs:
        return None
    return (
        f"tensor {ann.tensor!r} reaches |x| = {_peak(s):.3g} (>= {max_abs:g}): a fill "
        "value (an attention mask) or a range so wide that int8 would erase its "
        "ordinary values, so it stays float"
    )


def _shared_scale_ranges(d: Decision, ratio: float, evidence: Evidence) -> str | None:
    """A node whose activation inputs share one scale (its rule's ``shares_scale``: a Concat)
    while their ranges differ by more than ``ratio`` (box coordinates next to class scores)."""
    if not d.shares_scale:
        return None
    stats = evidence.stats
    ranges = [_peak(stats[t]) for t in d.tensors if t in stats and stats[t].count]
    ranges = [r for r in ranges if r > 0]
    if len(ranges) < 2 or max(ranges) / min(ranges) <= ratio:
        return None
    return (
        f"its inputs' ranges differ {max(ranges) / min(ranges):.0f}x (> {ratio:g}x);"
        " one shared scale would crush the small ones, so it stays float"
    )


def _weak_channels(d: Decision, fraction: float, evidence: Evidence) -> str | None:
    """A grouped (depthwise) Conv whose input has more than ``fraction`` of its channels
    peaking below :data:`WEAK_SHARE` of the tensor's peak: each such channel alone feeds its
    outputs, with fewer than 8 of int8's 127 levels."""
    tensor = evidence.facts.grouped_convs.get(d.node)
    if tensor is None or tensor not in evidence.stats:
        return None
    weak = evidence.stats[tensor].weak_channels(WEAK_SHARE)
    if weak is None or weak[0] <= fraction * weak[1]:
        return None
    return (
        f"{weak[0]} of its input's {weak[1]} channels peak below 1/{round(1 / WEAK_SHARE)} of "
        f"the tensor's peak (> weak_channel_fraction={fraction:g}): one per-tensor int8 scale "
        "leaves them under 8 levels, and each feeds its own outputs alone; the grouped conv "
        "stays float"
    )


def _weak_positions(d: Decision, fraction: float, evidence: Evidence) -> str | None:
    """A 1-D Conv before a LayerNormalization (``GraphFacts.position_norm_convs``) whose input
    has more than ``fraction`` of its positions (frames) peaking below :data:`WEAK_SHARE` of
    the tensor's peak: the normalisation blows their rounding noise up to full size
    (wav2vec2's GroupNorm feature encoder on speech with pauses)."""
    tensor = evidence.facts.position_norm_convs.get(d.node)
    if tensor is None or tensor not in evidence.stats:
        return None
    weak = evidence.stats[tensor].weak_positions(WEAK_SHARE)
    if weak is None or weak[0] <= fraction * weak[1]:
        return None
    return (
        f"{weak[0]} of its input's {weak[1]} positions (frames) peak below 1/"
        f"{round(1 / WEAK_SHARE)} of the tensor's peak (> weak_position_fraction={fraction:g}): "
        "one int8 scale leaves them under 8 levels, and the LayerNormalization after it scales "
        "each position to the same size, noise included; the conv stays float"
    )


# in order: a later exclusion's reason replaces an earlier one's for the same node
EXCLUSIONS: tuple[TensorExclusion | NodeExclusion, ...] = (
    TensorExclusion("mask_range", "mask_threshold", _mask_range),
    NodeExclusion("shared_scale_ranges", "concat_range_ratio", _shared_scale_ranges),
    NodeExclusion("weak_channels", "weak_channel_fraction", _weak_channels),
    NodeExclusion("weak_positions", "weak_position_fraction", _weak_positions),
)


def find_exclusions(
    annotations: Annotations,
    evidence: Evidence,
    options: PlacementOptions,
    exclusions: tuple[TensorExclusion | NodeExclusion, ...] = EXCLUSIONS,
) -> Excluded:
    """The tensors and nodes of ``annotations`` that the statistics keep float, with reasons."""
    tensors: dict[str, str] = {}
    nodes: dict[str, str] = {}
    for exclusion in exclusions:
        threshold = float(getattr(options, exclusion.option))
        if isinstance(exclusion, TensorExclusion):
            for ann in annotations.of_kind("activation"):
                if (why := exclusion.check(ann, threshold, evidence)) is not None:
                    tensors[ann.tensor] = why
        else:
            for d in annotations.decisions:
                if d.quantized and (why := exclusion.check(d, threshold, evidence)) is not None:
                    nodes[d.node] = why
    return Excluded(tensors, nodes)
