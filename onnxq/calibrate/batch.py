"""One batch's observation: its statistics as independent jobs, one per observed tensor
(:func:`observe_tasks`), that a statistics worker thread and the calibration loop take turns at
(:class:`BatchWork`), and the values of tensors inside control-flow bodies read back from their
probes (:func:`take_probes`).  The loop over the batches is :mod:`onnxq.calibrate.observation`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from onnxq import ir
from onnxq.calibrate.plan import PeaksPlan
from onnxq.errors import UnsupportedModelError
from onnxq.numerics.tensor_stats import TensorStats


def observe_tasks(
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
    if joined.size == 0:  # a batch without samples: nothing to record
        return
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


class BatchWork:
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


def take_probes(probes: ir.ProbePlan, outs: dict[str, Any], runs: dict[str, int]) -> None:
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


def stats_pool(workers: int) -> Any:
    """Where the statistics jobs run: a thread pool of ``workers`` threads, or (0) the
    caller's thread, each job at once."""
    if workers == 0:
        return _Inline()
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="onnxq-stats")
