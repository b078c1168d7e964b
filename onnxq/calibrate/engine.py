"""The streaming calibration engine.

One augmented model exposes exactly the tensors to observe as extra outputs; onnxruntime runs
it batch by batch, each batch's activations go to the tensors' :class:`TensorStats` and are
dropped.  Memory depends on the number of observed tensors, never on the number of batches.
A tensor that needs no histogram, that the graph keeps >= 0 and whose shape is a static
(N, C, H, W) is observed inside the graph instead (:func:`~onnxq.calibrate.plan.peaks_plan`):
a GlobalMaxPool gives
its per-channel maxima without converting it out of onnxruntime's blocked layout.
When exposing every tensor at once would pass ``memory_budget`` bytes for one batch, the tensors
are observed in groups, one pass over the data per group (the data must then be re-iterable).
A tensor inside an If/Loop/Scan body is threaded out to the top level (``onnxq.ir.probes``):
its statistics cover every run of its body, and a body that never ran on the data leaves its
tensors unobservable, with the reason.

How each tensor is observed is decided first (:mod:`onnxq.calibrate.plan`), then the batches
are observed (:func:`~onnxq.calibrate.observation.observe`) in one pass, or in shards
elsewhere (:mod:`onnxq.scale`) whose :class:`~onnxq.calibrate.observation.Observation` values
merge exactly, in order (:func:`finish`).  The sessions that run the batches are built in
:mod:`onnxq.calibrate.session`; each batch's statistics are taken in
:mod:`onnxq.calibrate.batch`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from onnxq import ir
from onnxq.calibrate.observation import Observation, observe, observe_shard, worker_state
from onnxq.calibrate.plan import (
    DEFAULT_HISTOGRAM_BUDGET,
    DEFAULT_HISTOGRAM_SAMPLE,
    DEFAULT_MEMORY_BUDGET,
    CalibrationPlan,
    plan_calibration,
)
from onnxq.data.inputs import Batch, InputSpec
from onnxq.errors import CalibrationDataError
from onnxq.numerics.tensor_stats import TensorStats

if TYPE_CHECKING:
    from onnxq.scale.executor import Executor


@dataclass
class CalibrationResult:
    """Statistics per observed tensor, and the first batches kept for fidelity checks."""

    stats: dict[str, TensorStats]
    batches_seen: int
    held: list[Batch] = field(default_factory=list)
    sample_share: int = 0  # values per sample the histograms took (0: every value)
    budget_sampled: int = 0  # histograms that the budget made sample more sparsely
    # samples in the data: each batch's first input of rank >= 2 along its first axis (a batch
    # without one: 1 sample); from a cache: the samples its statistics saw
    samples: int = 0
    # tensors asked for but not observed -> why (the data could be read only once, a
    # control-flow body that never ran)
    unobservable: dict[str, str] = field(default_factory=dict)
    # control-flow body (``Body.key``) -> how often it ran over the batches (an If branch
    # taken, a Loop's or Scan's iterations); bodies whose runs could not be counted are absent
    body_runs: dict[str, int] = field(default_factory=dict)


def calibrate(
    model: onnx.ModelProto,
    tensors: dict[str, bool],
    source: Iterable[Batch],
    inputs: list[InputSpec],
    *,
    max_batches: int | None = None,
    hold: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    histogram_sample: int = DEFAULT_HISTOGRAM_SAMPLE,
    histogram_budget: int = DEFAULT_HISTOGRAM_BUDGET,
    progress: bool = True,
    channels: frozenset[str] = frozenset(),
    positions: frozenset[str] = frozenset(),
    executor: Executor | None = None,
    optimize: bool = True,
) -> CalibrationResult:
    """Observe ``tensors`` (name -> needs a histogram) over the batches of ``source``.

    Min and max see every value.  A histogram gets every value of a sample (one item along
    the tensor's first axis) of at most ``histogram_sample`` values, else every s-th value of
    each sample, where s is the smallest prime at least the ratio that divides none of the
    tensor's dimensions (so the kept values cycle through every channel and position); s is
    fixed per tensor from the first batch's shapes.  ``histogram_sample=0`` keeps every value.
    ``histogram_budget`` caps the values one histogram counts over the whole calibration: when
    the source says how many batches it holds, a sample's share is at most the budget divided
    by the number of samples (:func:`sample_share`), so many batches cost less each; the share
    depends on the number of samples, not on how they are batched.
    Tensors in ``channels`` also get each channel's peak magnitude (axis 1); rank-3 tensors
    in ``positions`` get their positions (sample, t) counted by peak magnitude over axis 1
    (:meth:`TensorStats.weak_positions`).  A tensor the graph keeps >= 0
    (:meth:`ir.Graph.nonnegative`) is read for its maxima only and its minimum is recorded as
    0: every range includes 0, so no scale changes.  When such a tensor needs no histogram and
    has a static (N, C, H, W) shape, its maxima are taken inside the graph (a GlobalMaxPool).

    ``executor`` (:mod:`onnxq.scale`): observe shards of the batches there (on a Ray
    cluster, say) and merge them; the result is the same as without it.

    ``optimize=False`` runs the model as written (a Q/DQ model's own arithmetic, not
    onnxruntime's fused kernels); it runs in this process.
    """
    graph = ir.Graph(model)
    plan = plan_calibration(
        model,
        tensors,
        source,
        inputs,
        max_batches=max_batches,
        memory_budget=memory_budget,
        histogram_sample=histogram_sample,
        histogram_budget=histogram_budget,
        channels=channels,
        positions=positions,
        graph=graph,
    )
    return _observe_planned(model, graph, plan, source, inputs, hold, progress, executor, optimize)


def _observe_planned(
    model: onnx.ModelProto,
    graph: ir.Graph,
    plan: CalibrationPlan,
    source: Iterable[Batch],
    inputs: list[InputSpec],
    hold: int,
    progress: bool,
    executor: Executor | None,
    optimize: bool,
) -> CalibrationResult:
    """Observe ``source`` under ``plan``: in shards on ``executor``, or in this process."""
    if executor is not None and optimize:
        from onnxq.calibrate.shards import observe_sharded

        held, shards = observe_sharded(
            executor, observe_shard, worker_state, model, plan, source, inputs, hold, progress
        )
        return finish(plan, shards, held)
    observed = observe(
        model,
        plan,
        lambda: _limit(source, plan.max_batches),
        inputs,
        hold=hold,
        progress=progress,
        graph=graph,
        optimize=optimize,
    )
    return finish(plan, [observed], observed.held)


def finish(
    plan: CalibrationPlan, observations: Iterable[Observation], held: list[Batch]
) -> CalibrationResult:
    """The result of ``observations`` of consecutive shards of the data, in order: their
    merge, with the tensors that have no statistics (-> why) left out."""
    total: Observation | None = None
    for observed in observations:
        total = observed if total is None else total.merge(observed)
    if total is None or total.batches == 0:
        raise CalibrationDataError(
            "the calibration data yielded no batches; give at least one batch"
        )
    if total.samples == 0:
        raise CalibrationDataError(
            f"the {total.batches} calibration batch(es) hold no samples (their inputs are "
            "empty along the first axis); give batches with at least one sample"
        )
    unobservable = dict(total.declined)
    for name, bodies in total.bodies.items():
        if (why := ir.unrun(bodies, total.runs)) is not None:
            unobservable[name] = why
    stats = {name: s for name, s in total.stats.items() if name not in unobservable}
    return CalibrationResult(
        stats,
        total.batches,
        held,
        plan.share,
        plan.budget_sampled,
        total.samples,
        unobservable,
        total.runs,
    )


def _limit(source: Iterable[Batch], max_batches: int | None) -> Iterator[Batch]:
    it = iter(source)
    return it if max_batches is None else itertools.islice(it, max_batches)
