"""What one calibration observes and how, decided once before any batch runs.

A :class:`CalibrationPlan` fixes, from the model, the first batch and the number of batches,
everything that could otherwise depend on which batches a process sees: each tensor's
histogram stride (from the samples in the whole calibration, :func:`sample_share`), its batch
axis, whether its maxima are taken inside the graph (:class:`PeaksPlan`), and the groups of
tensors observed in one pass each (the memory budget).  Every shard of the data is observed
under the same plan, so shards merge into the statistics of one pass over all of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from onnxq import ir
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import batches_total, check_batch
from onnxq.errors import CalibrationDataError

DEFAULT_MEMORY_BUDGET = 4 * 2**30
DEFAULT_HISTOGRAM_SAMPLE = 65536  # values per sample that go into a histogram
DEFAULT_HISTOGRAM_BUDGET = 2**24  # values one histogram counts over the whole calibration
MIN_SAMPLE_SHARE = 1024  # the budget never takes a sample's share below this


@dataclass(frozen=True)
class CalibrationPlan:
    """How one calibration observes its tensors (see the module docstring).

    ``tensors``: name -> needs a histogram.  ``peaks``: the tensors observed through in-graph
    per-channel maxima; ``sizes``: bytes of one batch of each observed output; ``strides``:
    the histogram stride of each histogram tensor; ``axes``: batch axes other than the first;
    ``groups``: the tensors of each pass over the data.  ``share`` and ``budget_sampled`` are
    what :class:`~onnxq.calibrate.engine.CalibrationResult` reports of the histogram budget;
    ``total``: the batches of the calibration, when the source says (None: unknown).
    """

    tensors: dict[str, bool]
    channels: frozenset[str]
    positions: frozenset[str]
    nonnegative: frozenset[str]
    peaks: dict[str, PeaksPlan]
    sizes: dict[str, int]
    strides: dict[str, int]
    axes: dict[str, int]
    groups: list[list[str]]
    share: int
    budget_sampled: int
    max_batches: int | None
    total: int | None


def plan_calibration(
    model: onnx.ModelProto,
    tensors: dict[str, bool],
    source: Iterable[Batch],
    inputs: list[InputSpec],
    *,
    max_batches: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    histogram_sample: int = DEFAULT_HISTOGRAM_SAMPLE,
    histogram_budget: int = DEFAULT_HISTOGRAM_BUDGET,
    channels: frozenset[str] = frozenset(),
    positions: frozenset[str] = frozenset(),
    graph: ir.Graph | None = None,
) -> CalibrationPlan:
    """The plan to observe ``tensors`` (name -> needs a histogram) over ``source``
    (:func:`onnxq.calibrate.engine.calibrate` says what each argument does); reads the first batch
    of a re-iterable source."""
    graph = graph if graph is not None else ir.Graph(model)
    defined_in = ir.scope_index(ir.scopes(graph))
    scope = {name: defined_in.get(name, graph) for name in tensors}  # a body's, or the top
    names = sorted(tensors)
    first = first_batch(source, inputs)
    concrete = _concrete_shapes(model, graph, names, first)
    shapes = {name: concrete.get(name) or scope[name].shape(name) for name in names}
    peaks = _peaks_plans(graph, tensors, names, positions, scope, concrete)
    sizes = {
        name: 4 * peaks[name].channels if name in peaks else 4 * _numel(shapes[name])
        for name in names
    }
    total = total_batches(source, max_batches)
    share = sample_share(histogram_sample, histogram_budget, samples_total(first, total, inputs))
    symbols = batch_symbols(graph)
    axes = {name: axis for name in names if (axis := batch_axis(graph.shape(name), symbols))}
    strides = {
        name: _tensor_stride(shapes[name], share, axes.get(name, 0))
        for name in names
        if tensors[name]
    }
    budget_sampled = _budget_sampled(strides, shapes, axes, share, histogram_sample)
    groups = budget_groups(names, sizes, memory_budget)
    _check_passes(groups, names, source)
    return CalibrationPlan(
        tensors=dict(tensors),
        channels=frozenset(channels) & set(names),
        positions=frozenset(positions) & set(names),
        nonnegative=frozenset(name for name in names if scope[name].nonnegative(name)),
        peaks=peaks,
        sizes=sizes,
        strides=strides,
        axes=axes,
        groups=groups,
        share=share,
        budget_sampled=budget_sampled,
        max_batches=max_batches,
        total=total,
    )


def _peaks_plans(
    graph: ir.Graph,
    tensors: dict[str, bool],
    names: list[str],
    positions: frozenset[str],
    scope: dict[str, ir.Graph],
    concrete: dict[str, tuple[int | str | None, ...]],
) -> dict[str, PeaksPlan]:
    """The tensors observed through in-graph per-channel maxima: top-level tensors that need
    no histogram and no position counts, where :func:`peaks_plan` finds a plan."""
    return {
        name: plan
        for name in names
        if not tensors[name]
        and name not in positions
        and scope[name] is graph
        and (plan := peaks_plan(graph, name, concrete.get(name)))
    }


def _budget_sampled(
    strides: dict[str, int],
    shapes: dict[str, tuple[int | str | None, ...] | None],
    axes: dict[str, int],
    share: int,
    histogram_sample: int,
) -> int:
    """The histogram tensors whose stride the whole calibration's budget raised above the
    per-sample one (0 when the budget leaves every sample its ``histogram_sample`` values)."""
    if share == histogram_sample:
        return 0
    return sum(
        stride != _tensor_stride(shapes[name], histogram_sample, axes.get(name, 0))
        for name, stride in strides.items()
    )


def _check_passes(groups: list[list[str]], names: list[str], source: Iterable[Batch]) -> None:
    """Refuse several passes over a source that can be read only once."""
    if len(groups) > 1 and iter(source) is source:  # type: ignore[comparison-overlap]
        raise CalibrationDataError(
            f"observing {len(names)} tensors needs {len(groups)} passes over the data (memory "
            "budget), but the calibration source can be read only once; pass a folder, a list, "
            "or raise the memory budget"
        )


def batch_symbols(graph: ir.Graph) -> frozenset[str]:
    """The symbolic first dimensions of the model's inputs: their batch axes' names."""
    out = set()
    for name in graph.graph_inputs:
        shape = graph.shape(name)
        if shape and len(shape) >= 2 and isinstance(shape[0], str):
            out.add(shape[0])
    return frozenset(out)


def batch_axis(shape: tuple[int | str | None, ...] | None, symbols: frozenset[str]) -> int:
    """The axis of a tensor that holds the samples: the first, unless it is not an input's batch
    symbol and exactly one other axis is (a time-major [T, N, C] tensor inside an RNN)."""
    if not shape or not symbols or shape[0] in symbols:
        return 0
    found = [k for k, d in enumerate(shape) if isinstance(d, str) and d in symbols]
    return found[0] if len(found) == 1 else 0


def batch_samples(batch: Batch, inputs: list[InputSpec] | None = None) -> int:
    """Samples in one batch: its first input of rank >= 2 along its first axis, else 1.

    An input of rank 3 or less whose declared first dimension is fixed while a later one is
    symbolic has no batch axis ([3, H, W]: one image, as torchvision's detectors take it):
    one sample.  (Rank 4 and more: the first axis is the batch, as in NCHW.)"""
    declared = {spec.name: spec.shape for spec in inputs or ()}
    for name, value in batch.items():
        if getattr(value, "ndim", 0) >= 2:
            shape = declared.get(name)
            if (
                shape
                and len(shape) <= 3
                and isinstance(shape[0], int)
                and any(not isinstance(d, int) for d in shape[1:])
            ):
                return 1
            return int(value.shape[0])
    return 1


def sample_share(histogram_sample: int, budget: int, samples: int | None) -> int:
    """Values per sample that go into a histogram: ``histogram_sample`` (0: every value),
    lowered to ``budget / samples`` rounded down to a power of two (at least
    :data:`MIN_SAMPLE_SHARE`) when ``samples`` is known and the budget would be passed.
    The power of two keeps the share the same for sample counts that differ a little (a
    last, shorter batch)."""
    if histogram_sample <= 0 or budget <= 0 or not samples:
        return histogram_sample
    fair = budget // samples
    if fair >= histogram_sample:
        return histogram_sample
    return min(histogram_sample, max(MIN_SAMPLE_SHARE, 1 << max(0, fair.bit_length() - 1)))


def samples_total(
    first: Batch | None, batches: int | None, inputs: list[InputSpec] | None = None
) -> int | None:
    """Samples in the whole calibration, from the number of batches and the first batch's
    samples (:func:`batch_samples`); None when either is unknown."""
    if first is None or not batches:
        return None
    return batches * max(batch_samples(first, inputs), 1)


def _tensor_stride(shape: tuple[int | str | None, ...] | None, target: int, axis: int = 0) -> int:
    """The histogram stride of a tensor: 1 unless its concrete shape is known and a sample
    (everything but the batch ``axis``; all of it for rank <= 1) has more than ``target``."""
    if target <= 0 or shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return 1
    dims = [int(d) for d in shape]  # type: ignore[arg-type]
    per_sample = _numel(shape[:axis] + shape[axis + 1 :] if len(shape) >= 2 else shape)
    return _stride(per_sample, dims, target)


def _numel(shape: tuple[int | str | None, ...] | None) -> int:
    """Number of elements; unknown dimensions count as 64 (an unknown shape as 1M)."""
    if shape is None:
        return 1024 * 1024
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) and d > 0 else 64
    return n


def _stride(per_sample: int, dims: list[int], target: int) -> int:
    """1 when a sample has at most ``target`` values, else the smallest prime >= the ratio
    that divides no dimension (a stride sharing a factor with a dimension would sample the
    same few channels or columns over and over)."""
    if per_sample <= target:
        return 1
    p = max(2, -(-per_sample // target))
    while not _is_prime(p) or any(d % p == 0 for d in dims):
        p += 1
    return p


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % k for k in range(2, math.isqrt(n) + 1))


@dataclass(frozen=True)
class PeaksPlan:
    """A tensor observed inside the graph through its per-channel maxima."""

    tensor: str
    channels: int
    per_sample: int  # values per sample (C*H*W, static)


def peaks_plan(
    graph: ir.Graph, name: str, concrete: tuple[int | str | None, ...] | None = None
) -> PeaksPlan | None:
    """Observe ``name`` through in-graph per-channel maxima when that is exact: a float32
    tensor the graph keeps >= 0 (so its maxima give its whole range) with a static (N, C, H, W)
    shape, which onnxruntime may hold in its blocked layout.  (Only for tensors without a
    histogram: a histogram needs the values themselves, and a grid of them sampled in the
    graph chose worse ranges than the per-value stride; docs/calibration.md.)

    ``concrete``: the shape inferred afresh for the first batch, which must agree (a model's
    own shape annotations can be stale)."""
    shape = graph.shape(name)
    if (
        shape is None
        or len(shape) != 4
        or graph.elem_type(name) != onnx.TensorProto.FLOAT
        or not all(isinstance(d, int) and d > 0 for d in shape[1:])
        or (concrete is not None and tuple(concrete[1:]) != tuple(shape[1:]))
        or not graph.nonnegative(name)
    ):
        return None
    c, h, w = (int(d) for d in shape[1:])  # type: ignore[arg-type]
    return PeaksPlan(name, c, c * h * w)


def first_batch(source: Iterable[Batch], inputs: list[InputSpec]) -> Batch | None:
    """The first batch of a re-iterable source (to size the observed tensors), else None."""
    if iter(source) is source:  # type: ignore[comparison-overlap]
        return None
    for raw in source:
        return check_batch(raw, inputs, 0)
    return None


def _concrete_shapes(
    model: onnx.ModelProto, graph: ir.Graph, names: list[str], first: Batch | None
) -> dict[str, tuple[int | str | None, ...]]:
    """The observed tensors' shapes inferred with the first batch's concrete input shapes
    (graph shapes where that inference knows nothing)."""
    if first is None:
        return {}
    concrete: dict[str, tuple[int | str | None, ...]] = dict(
        ir.shapes_for_inputs(model, {k: v.shape for k, v in first.items()})
    )
    concrete.update({k: tuple(v.shape) for k, v in first.items()})
    return {name: concrete[name] for name in names if name in concrete}


def budget_groups(names: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    """Split tensors so that one batch of each group stays under ``budget`` bytes."""
    groups: list[list[str]] = [[]]
    used = 0
    for name in names:
        size = sizes[name]
        if groups[-1] and used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    return groups


def total_batches(source: Iterable[Batch], max_batches: int | None) -> int | None:
    total = batches_total(source)
    if total is None:
        return max_batches
    return total if max_batches is None else min(total, max_batches)
