"""The streaming calibration engine.

One augmented model exposes exactly the tensors to observe as extra outputs; onnxruntime runs
it batch by batch, each batch's activations go to the tensors' :class:`TensorStats` and are
dropped.  Memory depends on the number of observed tensors, never on the number of batches.
A tensor that needs no histogram, that the graph keeps >= 0 and whose shape is a static
(N, C, H, W) is observed inside the graph instead (:func:`_peaks_plan`): a GlobalMaxPool gives
its per-channel maxima without converting it out of onnxruntime's blocked layout.
When exposing every tensor at once would pass ``memory_budget`` bytes for one batch, the tensors
are observed in groups, one pass over the data per group (the data must then be re-iterable).
A tensor inside an If/Loop/Scan body is threaded out to the top level (``onnxq.ir.probes``):
its statistics cover every run of its body, and a body that never ran on the data leaves its
tensors unobservable, with the reason.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.data import batches_total, check_batch
from onnxq.errors import CalibrationDataError, InternalError, UnsupportedModelError
from onnxq.inputs import Batch, InputSpec
from onnxq.observers import TensorStats

DEFAULT_MEMORY_BUDGET = 4 * 2**30
DEFAULT_HISTOGRAM_SAMPLE = 65536  # values per sample that go into a histogram
DEFAULT_HISTOGRAM_BUDGET = 2**24  # values one histogram counts over the whole calibration
MIN_SAMPLE_SHARE = 1024  # the budget never takes a sample's share below this


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
    """An onnxruntime CPU session for ``model`` (external data for huge models).

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
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnxq-")))
        payload = ir.session_bytes_or_path(model, workdir)
        for level in levels:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4  # failures reach the user as onnxq errors, not logs
            if not spinning:
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.graph_optimization_level = level
            try:
                # onnxruntime prints an "EP Error ... retrying" banner on stdout on failure
                with contextlib.redirect_stdout(io.StringIO()):
                    return ort.InferenceSession(payload, opts, providers=["CPUExecutionProvider"])
            except Exception as exc:  # the next level, or the error below
                failure = exc
        raise UnsupportedModelError(
            f"onnxruntime cannot load the model: {_one_line(failure)}; onnxq calibrates with "
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
    graph (a GlobalMaxPool) instead of exposing it whole.  ``optimize=False`` runs the model
    as written (a Q/DQ model's own arithmetic, not onnxruntime's fused kernels).
    """
    graph = ir.Graph(model)
    defined_in = ir.scope_index(ir.scopes(graph))
    scope = {name: defined_in.get(name, graph) for name in tensors}  # a body's, or the top
    stats = {
        name: TensorStats(
            name,
            histogram=hist,
            channels=name in channels,
            positions=name in positions,
            nonnegative=scope[name].nonnegative(name),
        )
        for name, hist in tensors.items()
    }
    names = sorted(tensors)
    first = _first_batch(source, inputs)
    concrete = _concrete_shapes(model, graph, names, first)
    shapes = {name: concrete.get(name) or scope[name].shape(name) for name in names}
    peaks = {
        name: plan
        for name in names
        if not tensors[name]
        and name not in positions
        and scope[name] is graph
        and (plan := _peaks_plan(graph, name, concrete.get(name)))
    }
    sizes = {
        name: 4 * peaks[name].channels if name in peaks else 4 * _numel(shapes[name])
        for name in names
    }
    share = sample_share(
        histogram_sample,
        histogram_budget,
        _samples_total(first, _total(source, max_batches), inputs),
    )
    symbols = batch_symbols(graph)
    axes = {name: axis for name in names if (axis := batch_axis(graph.shape(name), symbols))}
    strides = {
        name: _tensor_stride(shapes[name], share, axes.get(name, 0))
        for name in names
        if tensors[name]
    }
    budget_sampled = (
        sum(
            stride != _tensor_stride(shapes[name], histogram_sample, axes.get(name, 0))
            for name, stride in strides.items()
        )
        if share != histogram_sample
        else 0
    )
    groups = _groups(names, sizes, memory_budget)
    if len(groups) > 1 and iter(source) is source:  # type: ignore[comparison-overlap]
        raise CalibrationDataError(
            f"observing {len(names)} tensors needs {len(groups)} passes over the data (memory "
            "budget), but the calibration source can be read only once; pass a folder, a list, "
            "or raise the memory budget"
        )
    held: list[Batch] = []
    seen = samples = 0
    runs: dict[str, int] = {}  # control-flow body -> how often it ran
    unobservable: dict[str, str] = {}
    # statistics of batch i are taken on a worker thread while onnxruntime runs batch i+1
    # (both release the GIL); once that run is done the main thread takes the tensors of batch
    # i that the worker has not started (:class:`_BatchWork`), so no core waits idle.  At most
    # two batches of activations are alive at once.  min/max alone is cheaper than a thread
    # hand-off: only histograms go to the worker
    workers = 1 if any(s.histogram for s in stats.values()) else 0
    with _executor(workers) as pool:
        for gi, group in enumerate(groups):
            plans = [peaks[name] for name in group if name in peaks]
            exposed = [name for name in group if name not in peaks]
            try:
                session, probes = (
                    _peaks_session(model, graph, exposed, plans, workers == 0, optimize)
                    if group
                    else (None, ir.ProbePlan())
                )
            except UnsupportedModelError as exc:
                raise _blamed(model, None, exc) from None
            unobservable.update(probes.declined)
            exposed = [name for name in exposed if name not in probes.declined]
            outputs = [name for name in exposed if name not in probes.probes]
            outputs += [vi.name for vi in probes.outputs] + ([ir.PEAKS_OUTPUT] if plans else [])
            group_runs: dict[str, int] = {}
            starts = np.cumsum([0] + [plan.channels for plan in plans])  # in the joined output
            order = sorted(range(len(exposed)), key=lambda k: -sizes[exposed[k]])  # big first
            label = "calibrating" if len(groups) == 1 else f"calibrating {gi + 1}/{len(groups)}"
            seen = 0
            pending: _BatchWork | None = None
            buffers = _OutputBuffers(session, outputs) if session is not None else None
            for index, raw in enumerate(
                _progress(_limit(source, max_batches), label, progress, _total(source, max_batches))
            ):
                batch = check_batch(raw, inputs, index)
                if gi == 0 and len(held) < hold:
                    held.append(batch)
                if gi == 0:
                    samples += _batch_samples(batch, inputs)
                if buffers is not None:
                    try:
                        values = buffers.run(batch, index)
                    except UnsupportedModelError as exc:
                        raise _blamed(model, batch, exc) from None
                    outs: dict[str, Any] = dict(zip(outputs, values, strict=True))
                    if probes.markers:
                        _take_probes(probes, outs, group_runs)
                    if pending is not None:
                        pending.finish()  # re-raises a NaN/Inf error of the previous batch
                    pending = _BatchWork(
                        _observe_tasks(stats, exposed, plans, starts, outs, strides, axes, index),
                        order,
                    )
                    pending.start(pool)
                seen += 1
            if pending is not None:
                pending.finish()
            for key, count in group_runs.items():  # every pass sees the same batches
                runs[key] = max(runs.get(key, 0), count)
            for name in probes.probes:
                if (why := probes.never_ran(name, runs)) is not None:
                    unobservable[name] = why
            session = buffers = None  # free this group's weights (and buffers) before the
            # next session loads its own
            if seen == 0:
                raise CalibrationDataError(
                    "the calibration data yielded no batches; give at least one batch"
                )
    if samples == 0:
        raise CalibrationDataError(
            f"the {seen} calibration batch(es) hold no samples (their inputs are empty along "
            "the first axis); give batches with at least one sample"
        )
    for name in unobservable:
        del stats[name]
    return CalibrationResult(stats, seen, held, share, budget_sampled, samples, unobservable, runs)


def _peaks_session(
    model: onnx.ModelProto,
    graph: ir.Graph,
    exposed: list[str],
    plans: list[_PeaksPlan],
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


def _batch_samples(batch: Batch, inputs: list[InputSpec] | None = None) -> int:
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


def _samples_total(
    first: Batch | None, batches: int | None, inputs: list[InputSpec] | None = None
) -> int | None:
    """Samples in the whole calibration, from the number of batches and the first batch's
    samples (:func:`_batch_samples`); None when either is unknown."""
    if first is None or not batches:
        return None
    return batches * max(_batch_samples(first, inputs), 1)


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
            f"calibration batch {index}{model}: onnxruntime failed on it: {_one_line(exc)}; "
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
    plans: list[_PeaksPlan],
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
    plans: list[_PeaksPlan],
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


@dataclass(frozen=True)
class _PeaksPlan:
    """A tensor observed inside the graph through its per-channel maxima."""

    tensor: str
    channels: int
    per_sample: int  # values per sample (C*H*W, static)


def _peaks_plan(
    graph: ir.Graph, name: str, concrete: tuple[int | str | None, ...] | None = None
) -> _PeaksPlan | None:
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
    return _PeaksPlan(name, c, c * h * w)


def _first_batch(source: Iterable[Batch], inputs: list[InputSpec]) -> Batch | None:
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


def _groups(names: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
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


def _limit(source: Iterable[Batch], max_batches: int | None) -> Iterator[Batch]:
    it = iter(source)
    return it if max_batches is None else itertools.islice(it, max_batches)


def _total(source: Iterable[Batch], max_batches: int | None) -> int | None:
    total = batches_total(source)
    if total is None:
        return max_batches
    return total if max_batches is None else min(total, max_batches)


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


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400] if text else type(exc).__name__


# --------------------------------------------------------------------------- cache
CACHE_FORMAT = "onnxq-calibration"
CACHE_VERSION = 1


def calibration_cache(
    stats: dict[str, TensorStats],
    graph: ir.Graph,
    backend: str | None = None,
    body_runs: dict[str, int] | None = None,
    unobservable: dict[str, str] | None = None,
) -> bytes:
    """Observed statistics as the JSON text of a calibration cache, with each tensor's inferred
    shape (``graph`` before Q/DQ are placed) and the ``backend`` whose placement chose the
    tensors (each backend observes different ones); for a model with control flow, how often
    each body ran (``bodies``) and the tensors that have no statistics, with why
    (``unobserved``)."""
    import json

    doc: dict[str, object] = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        **({"backend": backend} if backend else {}),
        "tensors": {
            name: {"shape": shape, "stats": stats[name].to_json()}
            for name, shape in _shapes_json(graph, sorted(stats)).items()
        },
        **({"bodies": dict(sorted(body_runs.items()))} if body_runs else {}),
        **({"unobserved": dict(sorted(unobservable.items()))} if unobservable else {}),
    }
    return (json.dumps(doc, indent=1) + "\n").encode("utf-8")


def cached_control_flow(path: str | os.PathLike[str]) -> tuple[dict[str, int], dict[str, str]]:
    """How often each control-flow body ran, and the tensors without statistics (-> why), as
    a cache of :func:`calibration_cache` recorded them (empty for a model without bodies)."""
    doc = _read_cache(Path(path))
    bodies, unobserved = doc.get("bodies", {}), doc.get("unobserved", {})
    if not isinstance(bodies, dict) or not isinstance(unobserved, dict):
        raise CalibrationDataError(f"{path}: malformed 'bodies' or 'unobserved' entries")
    return {str(k): int(v) for k, v in bodies.items()}, {
        str(k): str(v) for k, v in unobserved.items()
    }


def load_calibration(
    path: str | os.PathLike[str],
    graph: ir.Graph,
    wanted: dict[str, bool],
    backend: str | None = None,
) -> dict[str, TensorStats]:
    """Statistics for ``wanted`` tensors from a cache of :func:`calibration_cache` (those it
    records as unobserved are left out: :func:`cached_control_flow` says why)."""
    p = Path(path)
    doc = _read_cache(p)
    tensors = doc.get("tensors", {})
    unobserved = doc.get("unobserved", {})
    wanted = {t: hist for t, hist in wanted.items() if t not in unobserved}
    missing = sorted(t for t in wanted if t not in tensors)
    if missing:
        made = doc.get("backend")
        if backend and made and made != backend:
            raise CalibrationDataError(
                f"{p}: the cache was saved with --backend {made}, and --backend {backend} "
                f"quantizes other tensors ({len(missing)} without statistics, e.g. "
                f"{', '.join(missing[:3])}); load it with --backend {made}, or calibrate "
                f"again with data and --save-calibration under --backend {backend}"
            )
        raise CalibrationDataError(
            f"{p}: no statistics for {len(missing)} tensor(s) this model quantizes, e.g. "
            f"{', '.join(missing[:5])}; the cache belongs to another model or other settings: "
            "calibrate again with data"
        )
    shapes = _shapes_json(graph, wanted)
    changed = [t for t in wanted if tensors[t].get("shape") != shapes[t]]
    if changed:
        t = changed[0]
        raise CalibrationDataError(
            f"{p}: tensor {t!r} had shape {tensors[t].get('shape')} when calibrated, the model "
            f"now gives {shapes[t]} ({len(changed)} tensor(s) changed); calibrate "
            "again with data"
        )
    out = {}
    for name, needs_hist in wanted.items():
        try:
            stats = TensorStats.from_json(name, tensors[name]["stats"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationDataError(
                f"{p}: statistics of {name!r} are malformed ({exc})"
            ) from None
        if needs_hist and not stats.histogram:
            raise CalibrationDataError(
                f"{p}: tensor {name!r} was calibrated without a histogram (method minmax); "
                "calibrate again with the histogram method you want"
            )
        out[name] = stats
    return out


def _read_cache(p: Path) -> dict[str, Any]:
    """The JSON document of a calibration cache, checked for its format and version."""
    import json

    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationDataError(f"cannot read calibration cache {p}: {exc.strerror}") from None
    except ValueError as exc:
        raise CalibrationDataError(f"{p}: not a JSON calibration cache: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise CalibrationDataError(f"{p}: not an onnxq calibration cache (format field)")
    if doc.get("version") != CACHE_VERSION:
        raise CalibrationDataError(
            f"{p}: calibration cache version {doc.get('version')!r}, this onnxq reads "
            f"{CACHE_VERSION}; calibrate again with --save-calibration"
        )
    return doc


def _shapes_json(graph: ir.Graph, names: Iterable[str]) -> dict[str, list[int | None] | None]:
    """Each tensor's inferred shape as the cache records it (a body's tensor: from its body)."""
    defined_in = ir.scope_index(ir.scopes(graph))
    out: dict[str, list[int | None] | None] = {}
    for name in names:
        shape = defined_in.get(name, graph).shape(name)
        out[name] = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    return out
