"""The streaming calibration engine.

One augmented model exposes exactly the tensors to observe as extra outputs; onnxruntime runs
it batch by batch, each batch's activations go to the tensors' :class:`TensorStats` and are
dropped.  Memory depends on the number of observed tensors, never on the number of batches.
A tensor that needs no histogram, that the graph keeps >= 0 and whose shape is a static
(N, C, H, W) is observed inside the graph instead (:func:`~onnxq.calibration_plan.peaks_plan`):
a GlobalMaxPool gives
its per-channel maxima without converting it out of onnxruntime's blocked layout.
When exposing every tensor at once would pass ``memory_budget`` bytes for one batch, the tensors
are observed in groups, one pass over the data per group (the data must then be re-iterable).
A tensor inside an If/Loop/Scan body is threaded out to the top level (``onnxq.ir.probes``):
its statistics cover every run of its body, and a body that never ran on the data leaves its
tensors unobservable, with the reason.

How each tensor is observed is decided first (:mod:`onnxq.calibration_plan`), then the batches
are observed (:func:`observe`) in one pass, or in shards elsewhere (:mod:`onnxq.scale`) whose
:class:`Observation` values merge exactly, in order (:func:`finish`).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxq import device, ir
from onnxq.calibration_plan import (
    DEFAULT_HISTOGRAM_BUDGET,
    DEFAULT_HISTOGRAM_SAMPLE,
    DEFAULT_MEMORY_BUDGET,
    CalibrationPlan,
    PeaksPlan,
    batch_samples,
    plan_calibration,
)
from onnxq.data import check_batch
from onnxq.errors import CalibrationDataError, InternalError, UnsupportedModelError, one_line
from onnxq.inputs import Batch, InputSpec
from onnxq.tensor_stats import TensorStats

if TYPE_CHECKING:
    from onnxq.scale.calibration import CalibrationShard
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


def make_session(
    model: onnx.ModelProto,
    optimize: bool = True,
    workdir: Path | None = None,
    spinning: bool = False,
):
    """An onnxruntime session for ``model`` (external data for huge models), on the device
    and with the threads of :mod:`onnxq.device` (by default: the CPU, onnxruntime's threads).

    ``spinning``: let idle onnxruntime threads spin; only when no other thread of ours needs
    a core (a statistics worker competing with spinning threads loses).
    """
    import onnxruntime as ort

    levels = (
        [
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            # onnxruntime 1.31's layout optimizer can drop a tensor that calibration exposes
            # as an output (a grouped Conv's output read by Add(conv, conv): "Failed to
            # find node output"); the extended level keeps every value the same
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        ]
        if optimize
        else [ort.GraphOptimizationLevel.ORT_DISABLE_ALL]
    )
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(ir.scratch_dir())
        payload = ir.session_bytes_or_path(model, workdir)
        for level in levels:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4  # failures reach the user as onnxq errors, not logs
            if not spinning:
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.graph_optimization_level = level
            placed = device.configure(opts)
            try:
                # onnxruntime prints an "EP Error ... retrying" banner on stdout on failure
                with contextlib.redirect_stdout(io.StringIO()):
                    session = ort.InferenceSession(
                        payload, opts, providers=device.providers(), **placed
                    )
            except Exception as exc:  # the next level, or the error below
                failure = exc
                continue
            return device.confirm(session)
        raise UnsupportedModelError(
            f"onnxruntime cannot load the model: {one_line(failure, 400)}; onnxq calibrates with "
            "onnxruntime, so the model must run there",
            onnxruntime_failed=True,
        ) from None


@contextlib.contextmanager
def exposing(
    model: onnx.ModelProto, graph: ir.Graph, names: list[str]
) -> Iterator[onnx.ModelProto]:
    """``model`` with exactly ``names`` as its outputs, for the duration of the block.

    The outputs are swapped in place and restored afterwards: copying the model would hold a
    second copy of every weight (the 2 GB models this must handle).
    """
    with ir.with_outputs(model, [graph.value_info(name) for name in names]) as aug:
        yield aug


def augmented_session(
    model: onnx.ModelProto,
    graph: ir.Graph,
    names: list[str],
    optimize: bool = True,
    spinning: bool = False,
) -> Any:
    """An onnxruntime session of ``model`` whose outputs are exactly ``names``."""
    with exposing(model, graph, names) as aug:
        return make_session(aug, optimize, spinning=spinning)


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
    (:meth:`TensorStats.weak_positions`).  A tensor the
    graph keeps >= 0 (:meth:`ir.Graph.nonnegative`) is read for its maxima only and its
    minimum is recorded as 0: every range includes 0, so no scale changes.  When such a tensor
    needs no histogram and has a static (N, C, H, W) shape, its maxima are taken inside the
    graph (a GlobalMaxPool) instead of exposing it whole.

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
    if executor is not None and optimize:
        from onnxq.scale.calibration import observe_sharded

        held, shards = observe_sharded(
            executor, observe_shard, worker_state, model, plan, source, inputs, hold, progress
        )
        return finish(plan, shards, held)
    observed = observe(
        model,
        plan,
        lambda: _limit(source, max_batches),
        inputs,
        hold=hold,
        progress=progress,
        graph=graph,
        optimize=optimize,
    )
    return finish(plan, [observed], observed.held)


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
    # i that the worker has not started (:class:`_BatchWork`), so no core waits idle.  At most
    # two batches of activations are alive at once.  min/max alone is cheaper than a thread
    # hand-off: only histograms go to the worker
    with _executor(0 if observer.spinning else 1) as pool:
        for gi, group in enumerate(plan.groups):
            count = len(plan.groups)
            label = "calibrating" if count == 1 else f"calibrating {gi + 1}/{count}"
            source = _progress(iter(batches()), label, progress, plan.total)
            observer.pass_over(group, source, start, hold if gi == 0 else -1, pool)
    return observer.seen


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


class SessionCache:
    """The calibration session (and its probe plan) of the last group observed, for the next
    shard under the same plan; one at a time: the old one goes before a new one is built."""

    def __init__(self) -> None:
        self._key: object = None
        self._value: Any = None

    def get(self, key: object, build: Callable[[], Any]) -> Any:
        """The value cached under ``key``, else what ``build()`` gives (then cached)."""
        if self._key != key:
            self._key = self._value = None  # free the old session's weights first
            self._value = build()
            self._key = key
        return self._value


@dataclass
class WorkerState:
    """What a worker of a sharded calibration keeps between shards: the model, its graph,
    the last session (:mod:`onnxq.scale.calibration`)."""

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
                lambda: _peaks_session(
                    self.model, self.graph, exposed, plans, self.spinning, self.optimize
                ),
            )
        except UnsupportedModelError as exc:
            raise _blamed(self.model, None, exc) from None

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
        pending: _BatchWork | None = None
        buffers = _OutputBuffers(session, outputs) if session is not None else None
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
                raise _blamed(self.model, batch, exc) from None
            outs: dict[str, Any] = dict(zip(outputs, values, strict=True))
            if probes.markers:
                _take_probes(probes, outs, runs)
            if pending is not None:
                pending.finish()  # re-raises a NaN/Inf error of the previous batch
            tasks = _observe_tasks(
                seen.stats, exposed, plans, starts, outs, plan.strides, plan.axes, index
            )
            pending = _BatchWork(tasks, order)
            pending.start(pool)
        if pending is not None:
            pending.finish()
        seen.batches = count  # every pass sees the same batches
        for key, ran in runs.items():
            seen.runs[key] = max(seen.runs.get(key, 0), ran)
        for name in probes.probes:
            seen.bodies[name] = probes.conditions(name)


def _peaks_session(
    model: onnx.ModelProto,
    graph: ir.Graph,
    exposed: list[str],
    plans: list[PeaksPlan],
    spinning: bool,
    optimize: bool = True,
) -> tuple[Any, ir.ProbePlan]:
    """A session whose outputs are the top-level tensors of ``exposed``, the probes of its
    tensors inside control-flow bodies (``ProbePlan.outputs``) and the joined maxima of
    ``plans``; and the probe plan that reads the bodies' values back."""
    with ir.with_probes(model, exposed) as probes:
        top = [graph.value_info(n) for n in exposed if n not in probes.chains]
        with ir.with_channel_peaks(
            model, top + probes.outputs, [plan.tensor for plan in plans]
        ) as aug:
            return make_session(aug, optimize=optimize, spinning=spinning), probes


def _take_probes(probes: ir.ProbePlan, outs: dict[str, Any], runs: dict[str, int]) -> None:
    """Put each body tensor's values of one batch (a list: one array per run of its body)
    into ``outs`` and add up how often each body ran."""
    for key, count in probes.runs(outs).items():
        runs[key] = runs.get(key, 0) + count
    for name, probe in probes.probes.items():
        outs[name] = _joined(probe.values(outs))


def _joined(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Consecutive arrays of the same trailing shape joined along their first axis (a Loop's
    iterations usually are): fewer, larger statistics updates, the same values."""
    out: list[np.ndarray] = []
    run: list[np.ndarray] = []
    for part in parts:
        if run and (part.ndim == 0 or part.shape[1:] != run[0].shape[1:]):
            out.append(np.concatenate(run) if len(run) > 1 else run[0])
            run = []
        (run if part.ndim else out).append(part)
    if run:
        out.append(np.concatenate(run) if len(run) > 1 else run[0])
    return out


class _Inline:
    """An executor that runs each job at once (no worker thread)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        done: Future[None] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # re-raised by .result(), like a worker's failure
            done.set_exception(exc)
        return done


def _executor(workers: int) -> Any:
    if workers == 0:
        return _Inline()
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="onnxq-stats")


def run_batch(
    session: Any, names: list[str], batch: Batch, index: int, what: str = ""
) -> list[np.ndarray]:
    """``session.run`` on a batch already checked against the model's inputs, with
    onnxruntime's failure as an :class:`UnsupportedModelError` that names the batch (and
    ``what`` model, when given): the data matches what the model declares, so the model does
    not run on it."""
    try:
        return list(session.run(names, batch))
    except Exception as exc:
        model = f" (the {what} model)" if what else ""
        raise UnsupportedModelError(
            f"calibration batch {index}{model}: onnxruntime failed on it: {one_line(exc, 400)}; "
            "the batch matches the model's declared inputs, so the model itself does not run "
            "on such data in onnxruntime (a size its graph cannot take, say): check the "
            "model on this batch",
            onnxruntime_failed=True,
        ) from None


def _blamed(model: onnx.ModelProto, batch: Batch | None, error: UnsupportedModelError) -> Exception:
    """The error for onnxruntime failing on onnxq's calibration copy of ``model`` (the
    observed tensors exposed as outputs): the model's own ``error`` when the model itself
    fails too (to load, or on ``batch``), else an :class:`InternalError`."""
    try:
        session = make_session(model)
        if batch is not None:
            session.run(None, batch)
    except Exception:
        return error
    return InternalError(
        "onnxruntime fails on onnxq's calibration copy of the model (the observed tensors "
        f"exposed as outputs), though it runs the model itself: {error}",
        onnxruntime_failed=True,
    )


class _OutputBuffers:
    """Runs a calibration session into two sets of output arrays that take turns.

    onnxruntime otherwise gives each run's outputs fresh memory from its arena, which frees
    them only when numpy drops them, one batch later (the statistics of batch i are taken
    while batch i+1 runs).  Where the two live sets land in the arena varies with the
    process's address layout: the arena grew by a whole batch of activations at a random
    batch, and the more batches, the likelier (mobilenet_v2: 254-267 MB or 283-292 MB at the
    end of 512 batches, from the jump at batch 7, 10, 72 or 360).  Bound buffers leave
    nothing of the outputs to the arena, and the process's memory stops moving after the
    first batches.  Where onnxruntime answers with a value of its own rather than the bound
    buffer, that value is used.

    The k-th bound run writes set k % 2, which is free again: the batch that used it before
    is at least two batches back, and a batch's statistics are done (``_BatchWork.finish``)
    before the batch after it runs.  The first batch runs
    unbound and gives the outputs' shapes and types; a batch whose inputs differ in shape or
    type from the first runs unbound, and so does every batch once onnxruntime refuses the
    bound buffers (an output whose shape depends on the data, say).
    """

    def __init__(self, session: Any, names: list[str]) -> None:
        self._session = session
        self._names = names
        self._signature: tuple[tuple[str, tuple[int, ...], str], ...] | None = None
        self._sets: list[list[np.ndarray]] = []
        self._values: list[list[Any]] = []  # the sets as onnxruntime values, made once
        self._turn = 0
        self._bound = True

    def run(self, batch: Batch, index: int) -> list[np.ndarray]:
        signature = tuple(
            (name, tuple(value.shape), value.dtype.str) for name, value in sorted(batch.items())
        )
        if self._signature is None:
            values = run_batch(self._session, self._names, batch, index)
            self._signature = signature
            if all(isinstance(v, np.ndarray) and v.dtype != object for v in values):
                import onnxruntime as ort

                self._sets = [[np.empty_like(v) for v in values] for _ in range(2)]
                self._values = [
                    [ort.OrtValue.ortvalue_from_numpy(b) for b in bufs] for bufs in self._sets
                ]
            else:  # a sequence or map output: nothing to bind
                self._bound = False
            return values
        if not self._bound or signature != self._signature:
            return run_batch(self._session, self._names, batch, index)
        out = self._sets[self._turn % 2]
        binding = self._session.io_binding()
        inputs = {name: np.ascontiguousarray(value) for name, value in batch.items()}
        for name, value in inputs.items():  # (alive until the run is done)
            binding.bind_cpu_input(name, value)
        for name, value in zip(self._names, self._values[self._turn % 2], strict=True):
            binding.bind_ortvalue_output(name, value)
        try:
            self._session.run_with_iobinding(binding)
            results = binding.get_outputs()
        except Exception:  # bound buffers refused: the plain run says what went wrong, if
            self._bound = False  # anything did
            self._sets, self._values = [], []
            return run_batch(self._session, self._names, batch, index)
        self._turn += 1
        # onnxruntime may answer with a value of its own instead of filling the buffer (a
        # graph input exposed as an output comes back as the input itself); it is copied, as
        # it can alias an input array that the caller drops before the statistics are taken
        return [
            buffer if result.data_ptr() == buffer.ctypes.data else np.array(result.numpy())
            for buffer, result in zip(out, results, strict=True)
        ]


def _observe_tasks(
    stats: dict[str, TensorStats],
    exposed: list[str],
    plans: list[PeaksPlan],
    starts: np.ndarray,
    outs: dict[str, np.ndarray],
    strides: dict[str, int],
    axes: dict[str, int],
    index: int,
) -> list[Callable[[], None]]:
    """One batch's observation as independent jobs: one per ``exposed`` tensor (whole), in
    ``exposed`` order, then one for every ``plans`` tensor at once (from the joined per-channel
    maxima, where plan k holds channels ``starts[k]:starts[k + 1]``).  Each job touches only
    its own tensors' statistics."""
    where = f" in calibration batch {index}"

    def whole(name: str) -> Callable[[], None]:
        def job() -> None:
            value = outs[name]  # a control-flow body's tensor: one array per run of the body
            for part in value if isinstance(value, list) else [value]:
                if np.issubdtype(part.dtype, np.floating):
                    stats[name].update(
                        part, where=where, stride=strides.get(name, 1), batch_axis=axes.get(name, 0)
                    )

        return job

    tasks = [whole(name) for name in exposed]
    if plans:
        tasks.append(lambda: _observe_peaks(stats, plans, starts, outs[ir.PEAKS_OUTPUT], index))
    return tasks


def _observe_peaks(
    stats: dict[str, TensorStats],
    plans: list[PeaksPlan],
    starts: np.ndarray,
    joined: np.ndarray,
    index: int,
) -> None:
    joined = joined.reshape(joined.shape[0], -1)  # per-channel maxima of every plan, joined
    if joined.shape[1] != starts[-1]:
        raise UnsupportedModelError(
            f"calibration batch {index}: onnxruntime gives {joined.shape[1]} channels in all "
            f"for {len(plans)} tensors (e.g. {plans[0].tensor!r}) whose shapes the model "
            f"declares with {starts[-1]}: its shape information is "
            "stale; remove the model's value_info and run onnx.shape_inference, or calibrate "
            "with a histogram method (those tensors are then read whole)"
        )
    row_max = np.maximum.reduceat(joined, starts[:-1], axis=1).astype(np.float64)  # (N, plans)
    for k, plan in enumerate(plans):
        channel_max = joined[:, starts[k] : starts[k + 1]]
        stats[plan.tensor].update_peaks(
            row_max[:, k],
            joined.shape[0] * plan.per_sample,
            f" in calibration batch {index}",
            channel_max,
        )


class _BatchWork:
    """One batch's observation jobs, taken one at a time by whichever thread is free: the
    statistics worker (:meth:`start`) and, in :meth:`finish`, the caller's thread.  Each job
    runs exactly once, so a tensor's statistics see the batches in order.  Errors are kept by
    job position and the first one re-raised, so the message does not depend on which thread
    met it."""

    def __init__(self, tasks: list[Callable[[], None]], order: list[int]) -> None:
        self._tasks = tasks
        # the larger jobs first (``order``, over the leading jobs), the rest after, in turn
        self._order = list(order) + [k for k in range(len(tasks)) if k >= len(order)]
        self._next = 0
        self._lock = threading.Lock()
        self._errors: dict[int, BaseException] = {}
        self._future: Future[None] | None = None

    def start(self, pool: Any) -> None:
        self._future = pool.submit(self._drain)

    def finish(self) -> None:
        self._drain()
        if self._future is not None:
            self._future.result()
        self._tasks = []  # the batch's outputs are free now, whoever still holds this object
        if self._errors:
            raise self._errors[min(self._errors)]

    def _drain(self) -> None:
        while True:
            with self._lock:
                at = self._next
                self._next += 1
            if at >= len(self._order):
                return
            k = self._order[at]
            try:
                self._tasks[k]()
            except BaseException as exc:  # re-raised by finish()
                self._errors[k] = exc


def _limit(source: Iterable[Batch], max_batches: int | None) -> Iterator[Batch]:
    it = iter(source)
    return it if max_batches is None else itertools.islice(it, max_batches)


def _progress(it: Iterator[Batch], label: str, enabled: bool, total: int | None) -> Iterator[Batch]:
    if not enabled:
        return it
    from tqdm import tqdm

    # disable=None: no bar when stderr is not a terminal (logs stay one line per error)
    return iter(
        tqdm(
            it,
            desc=label,
            total=total,
            unit="batch",
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
            disable=None,
        )
    )
