"""Where work that splits into shards runs: this process, or a Ray cluster (:mod:`.ray_executor`).

An :class:`Executor` runs ``task(state, shard)`` for every shard and gives the results back in
the order of the shards, so the caller folds them in a fixed order: calibration statistics
merge exactly, so the result does not depend on how the data was split, nor on where each
shard ran.  ``context`` is the large value every shard needs (the model): it travels once per
worker, where ``setup(context)`` makes the worker's ``state`` from it (the parsed model, a
session cache), kept for every later shard that worker runs.  A shard is a small value (a range
of files, a chunk of batches) and so is its result (observer state, never activations).

``task`` and ``setup`` are module-level functions (a worker imports them by name).  A shard
fails as it would here: the first failing shard, in shard order, raises its own error, and
the shards after it are cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, Protocol, TypeVar

C = TypeVar("C")  # the context: what every shard needs, sent once per worker
W = TypeVar("W")  # a worker's state, made from the context
S = TypeVar("S")  # a shard
R = TypeVar("R")  # a shard's result

Task = Callable[[W, S], R]
Setup = Callable[[C], W]


class Executor(Protocol):
    """Runs tasks over shards (see the module docstring)."""

    @property
    def parallelism(self) -> int:
        """How many shards run at once."""
        ...

    @property
    def shard_batches(self) -> int | None:
        """Batches per shard of calibration data (None: the caller decides)."""
        ...

    def map(
        self, task: Task[W, S, R], setup: Setup[C, W], context: C, shards: Iterable[S]
    ) -> Generator[R, None, None]:
        """``task(setup(context), shard)`` for each of ``shards``, the results in shard order.

        ``shards`` is read lazily, as workers free up; closing the iterator early cancels
        what still runs."""
        ...


class InProcess:
    """Runs every shard in this process, one after the other: the executor that the others
    must match, and a way to run sharding (and test it) without a cluster.  The worker state
    is made once per context and kept while this executor lives."""

    def __init__(self, shard_batches: int | None = None) -> None:
        self._shard_batches = shard_batches
        self._states: dict[int, tuple[Any, Any]] = {}  # id(context) -> (context, state)

    @property
    def parallelism(self) -> int:
        """One shard at a time."""
        return 1

    @property
    def shard_batches(self) -> int | None:
        """Batches per shard (None: the caller decides)."""
        return self._shard_batches

    def map(
        self, task: Task[W, S, R], setup: Setup[C, W], context: C, shards: Iterable[S]
    ) -> Generator[R, None, None]:
        """``task(state, shard)`` for each shard, here and in order."""
        if id(context) not in self._states:
            self._states[id(context)] = (context, setup(context))  # (the context kept alive)
        state = self._states[id(context)][1]
        for shard in shards:
            yield task(state, shard)
