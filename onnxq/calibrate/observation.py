"""Observing the batches under a :class:`CalibrationPlan`: one pass per group of tensors, each
batch run by the group's session (:mod:`onnxq.calibrate.session`) and its statistics taken
(:mod:`onnxq.calibrate.batch`), into an :class:`Observation`.  Observations of consecutive
shards of the batches merge exactly; a worker of a sharded calibration (:mod:`onnxq.scale`)
observes its shards with :func:`observe_shard`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.calibrate.batch import BatchWork, observe_tasks, stats_pool, take_probes
from onnxq.calibrate.plan import CalibrationPlan, PeaksPlan, batch_samples
from onnxq.calibrate.session import OutputBuffers, SessionCache, blamed_error, peaks_session
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.errors import UnsupportedModelError
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.runtime.progress import counted

if TYPE_CHECKING:
    from onnxq.calibrate.shards import CalibrationShard


@dataclass
class Observation:
    """What a :class:`CalibrationPlan` saw over consecutive batches (all of them, or one shard
    of them): the statistics, the batches and samples, how often each control-flow body ran,
    the body tensors the probes could not thread out (-> why), and for each body tensor the
    bodies around it, outermost first, with why it has no value if one never ran
    (:func:`onnxq.ir.unrun`); ``held``: the first batches, when asked to hold them."""

    stats: dict[str, TensorStats]
    batches: int = 0
    samples: int = 0
    runs: dict[str, int] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    bodies: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    held: list[Batch] = field(default_factory=list)

    def merge(self, later: Observation) -> Observation:
        """Add the observation of the batches right after these, in place; exact
        (:meth:`TensorStats.merge`), so shards merge into one pass over all of them."""
        for name, stats in self.stats.items():
            stats.merge(later.stats[name])
        self.batches += later.batches
        self.samples += later.samples
        for key, count in later.runs.items():
            self.runs[key] = self.runs.get(key, 0) + count
        self.declined.update(later.declined)
        self.bodies.update(later.bodies)
        return self


def observe(
    model: onnx.ModelProto,
    plan: CalibrationPlan,
    batches: Callable[[], Iterable[Any]],
    inputs: list[InputSpec],
    *,
    start: int = 0,
    hold: int = 0,
    progress: bool = False,
    graph: ir.Graph | None = None,
    sessions: SessionCache | None = None,
    optimize: bool = True,
) -> Observation:
    """One pass per group of ``plan`` over the batches that ``batches()`` gives (called once
    per pass; its first batch is batch ``start`` of the whole calibration), holding the first
    ``hold`` of them.  ``sessions``: where a caller that observes several shards keeps the
    last group's session for the next one."""
    graph = graph if graph is not None else ir.Graph(model)
    observer = _Observer(model, graph, plan, inputs, sessions or SessionCache(), optimize)
    # statistics of batch i are taken on a worker thread while onnxruntime runs batch i+1
    # (both release the GIL); once that run is done the main thread takes the tensors of batch
    # i that the worker has not started (:class:`BatchWork`), so no core waits idle.  At most
    # two batches of activations are alive at once.  min/max alone is cheaper than a thread
    # hand-off: only histograms go to the worker
    with stats_pool(0 if observer.spinning else 1) as pool:
        for gi, group in enumerate(plan.groups):
            count = len(plan.groups)
            label = "calibrating" if count == 1 else f"calibrating {gi + 1}/{count}"
            source = counted(iter(batches()), label, progress, plan.total)
            observer.pass_over(group, source, start, hold if gi == 0 else -1, pool)
    return observer.seen


class _Observer:
    """Observes the groups of a plan, one pass each, into :attr:`seen`."""

    def __init__(
        self,
        model: onnx.ModelProto,
        graph: ir.Graph,
        plan: CalibrationPlan,
        inputs: list[InputSpec],
        sessions: SessionCache,
        optimize: bool = True,
    ) -> None:
        self.model, self.graph, self.plan, self.inputs = model, graph, plan, inputs
        self.sessions, self.optimize = sessions, optimize
        # no statistics thread (min/max only): onnxruntime's idle threads may spin
        self.spinning = not any(plan.tensors.values())
        self.seen = Observation(
            {
                name: TensorStats(
                    name,
                    histogram=hist,
                    channels=name in plan.channels,
                    positions=name in plan.positions,
                    nonnegative=name in plan.nonnegative,
                )
                for name, hist in plan.tensors.items()
            }
        )

    def _session(self, exposed: list[str], plans: list[PeaksPlan]) -> Any:
        if not exposed and not plans:
            return None, ir.ProbePlan()
        key = (tuple(exposed), tuple(plan.tensor for plan in plans), self.spinning, self.optimize)
        try:
            return self.sessions.get(
                key,
                lambda: peaks_session(
                    self.model, self.graph, exposed, plans, self.spinning, self.optimize
                ),
            )
        except UnsupportedModelError as exc:
            raise blamed_error(self.model, None, exc) from None

    def pass_over(
        self, group: list[str], batches: Iterator[Any], start: int, hold: int, pool: Any
    ) -> None:
        """One pass over ``batches`` for the tensors of ``group``; ``hold`` >= 0: the first
        pass, which holds that many batches and counts the samples."""
        plan, seen = self.plan, self.seen
        plans = [plan.peaks[name] for name in group if name in plan.peaks]
        exposed = [name for name in group if name not in plan.peaks]
        session, probes = self._session(exposed, plans)
        seen.declined.update(probes.declined)
        exposed = [name for name in exposed if name not in probes.declined]
        outputs = [name for name in exposed if name not in probes.probes]
        outputs += [vi.name for vi in probes.outputs] + ([ir.PEAKS_OUTPUT] if plans else [])
        runs: dict[str, int] = {}
        starts = np.cumsum([0] + [p.channels for p in plans])  # in the joined output
        order = sorted(range(len(exposed)), key=lambda k: -plan.sizes[exposed[k]])  # big first
        pending: BatchWork | None = None
        buffers = OutputBuffers(session, outputs) if session is not None else None
        count = 0
        for index, raw in enumerate(batches, start):
            batch = check_batch(raw, self.inputs, index)
            if len(seen.held) < hold:
                seen.held.append(batch)
            if hold >= 0:
                seen.samples += batch_samples(batch, self.inputs)
            count += 1
            if buffers is None:
                continue
            try:
                values = buffers.run(batch, index)
            except UnsupportedModelError as exc:
                raise blamed_error(self.model, batch, exc) from None
            outs: dict[str, Any] = dict(zip(outputs, values, strict=True))
            if probes.markers:
                take_probes(probes, outs, runs)
            if pending is not None:
                pending.finish()  # re-raises a NaN/Inf error of the previous batch
            tasks = observe_tasks(
                seen.stats, exposed, plans, starts, outs, plan.strides, plan.axes, index
            )
            pending = BatchWork(tasks, order)
            pending.start(pool)
        if pending is not None:
            pending.finish()
        seen.batches = count  # every pass sees the same batches
        for key, ran in runs.items():
            seen.runs[key] = max(seen.runs.get(key, 0), ran)
        for name in probes.probes:
            seen.bodies[name] = probes.conditions(name)


@dataclass
class WorkerState:
    """What a worker of a sharded calibration keeps between shards: the model, its graph,
    the last session (:mod:`onnxq.calibrate.shards`)."""

    model: onnx.ModelProto
    graph: ir.Graph
    sessions: SessionCache


def worker_state(model: onnx.ModelProto) -> WorkerState:
    """A worker's state for ``model`` (the executor's ``setup``)."""
    return WorkerState(model, ir.Graph(model), SessionCache())


def observe_shard(state: WorkerState, shard: CalibrationShard) -> Observation:
    """Observe one shard of a sharded calibration (the executor's ``task``)."""
    return observe(
        state.model,
        shard.plan,
        lambda: shard.batches,
        shard.inputs,
        start=shard.start,
        graph=state.graph,
        sessions=state.sessions,
    )
