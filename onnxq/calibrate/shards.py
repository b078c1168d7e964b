"""Calibration over shards: the batches split into consecutive ranges, each observed by an
:class:`~onnxq.scale.executor.Executor` under the driver's :class:`CalibrationPlan`, the
observations merged in order (:func:`onnxq.calibrate.engine.finish`).

The plan fixes everything that could depend on which batches a worker sees (histogram strides
from the whole calibration's sample count, batch axes, in-graph maxima, tensor groups), and
observer state merges exactly, so the result is the one of a single pass over all the batches,
whatever the shard sizes.  The fidelity batches are the first batches of the data, read here.

A shard is either a *window* of a source read from files (``source.window(start, stop)``: file
names that every worker reads from a shared filesystem) or a *chunk*: up to ``shard_batches``
batches of an in-memory source, which travel to the worker through the executor (Ray's object
store).  Each worker parses the model once and keeps its last calibration session for the
next shard of the same plan (:class:`onnxq.calibrate.observation.WorkerState`): the task
that observes a shard and the worker's setup come from :func:`onnxq.calibrate.engine.calibrate`, so
that this module needs nothing of the engine itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import onnx

from onnxq.calibrate.plan import CalibrationPlan
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.runtime.progress import bar
from onnxq.scale.executor import Executor, Setup, Task

SHARDS_PER_WORKER = 4  # shards per parallel worker, when the number of batches is known
STREAM_SHARD = 16  # batches per chunk of a source that does not say how many it holds
MAX_SHARD = 64  # batches per chunk at most: what one worker holds of an in-memory source


@dataclass(frozen=True)
class CalibrationShard:
    """Batches ``start`` and on of the calibration (``batches``: a window of a source read
    from files, or a list), to observe under ``plan``."""

    plan: CalibrationPlan
    inputs: list[InputSpec]
    start: int
    batches: Iterable[Any]


def observe_sharded(
    executor: Executor,
    task: Task[Any, CalibrationShard, Any],
    setup: Setup[onnx.ModelProto, Any],
    model: onnx.ModelProto,
    plan: CalibrationPlan,
    source: Iterable[Any],
    inputs: list[InputSpec],
    hold: int,
    progress: bool,
) -> tuple[list[Batch], Iterator[Any]]:
    """The first ``hold`` batches (checked) and the observations of the shards of
    ``source``'s batches (``task(setup(model), shard)`` each), in order, as ``executor``
    delivers them."""
    size = shard_size(executor, plan.total)
    if hasattr(source, "window") and plan.total is not None:
        held = _held(itertools.islice(source, min(hold, plan.total)), inputs)
        shards: Iterator[CalibrationShard] = _windows(source, plan, inputs, size)
    else:
        held = []
        shards = _chunks(source, plan, inputs, size, held, hold)
    observed = executor.map(task, setup, model, shards)
    return held, _counted(observed, plan.total, progress)


def shard_size(executor: Executor, total: int | None) -> int:
    """Batches per shard: the executor's choice, else about :data:`SHARDS_PER_WORKER` shards
    per parallel worker (at most :data:`MAX_SHARD` batches), :data:`STREAM_SHARD` when the
    number of batches is unknown."""
    if executor.shard_batches is not None:
        return max(1, executor.shard_batches)
    if total is None:
        return STREAM_SHARD
    wanted = SHARDS_PER_WORKER * max(1, executor.parallelism)
    return max(1, min(MAX_SHARD, math.ceil(total / wanted)))


def _held(batches: Iterable[Any], inputs: list[InputSpec]) -> list[Batch]:
    return [check_batch(raw, inputs, index) for index, raw in enumerate(batches)]


def _windows(
    source: Any, plan: CalibrationPlan, inputs: list[InputSpec], size: int
) -> Iterator[CalibrationShard]:
    assert plan.total is not None
    for start in range(0, plan.total, size):
        stop = min(start + size, plan.total)
        yield CalibrationShard(plan, inputs, start, source.window(start, stop))


def _chunks(
    source: Iterable[Any],
    plan: CalibrationPlan,
    inputs: list[InputSpec],
    size: int,
    held: list[Batch],
    hold: int,
) -> Iterator[CalibrationShard]:
    """Chunks of ``size`` batches of an in-memory source, read as the executor asks for
    them; the first ``hold`` batches also go (checked) into ``held``."""
    batches = iter(source)
    if plan.max_batches is not None:
        batches = itertools.islice(batches, plan.max_batches)
    start = 0
    while chunk := list(itertools.islice(batches, size)):
        for index in range(start, min(start + len(chunk), hold)):
            held.append(check_batch(chunk[index - start], inputs, index))
        yield CalibrationShard(plan, inputs, start, chunk)
        start += len(chunk)


def _counted(observed: Iterator[Any], total: int | None, progress: bool) -> Iterator[Any]:
    """``observed``, with a progress bar of the batches done when ``progress``."""
    if not progress:
        yield from observed
        return
    with bar("calibrating", total) as counter:
        for observation in observed:
            counter.update(observation.batches)
            yield observation
