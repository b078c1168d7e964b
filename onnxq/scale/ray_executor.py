"""An :class:`~onnxq.scale.executor.Executor` on a Ray cluster (``pip install 'onnxq[ray]'``).

Each shard is one Ray task.  The context (the model) is put into Ray's object store once; a
worker process fetches it at its first shard and keeps ``setup(context)`` for every later shard
of the same context (:func:`_run`), so the model travels once per worker, not per task.  A
shard travels as the task's argument (Ray puts a large one, a chunk of batches, into the object
store), the result comes back the same way.  At most ``2 x parallelism`` shards are in flight,
so an in-memory source is read only as fast as the cluster observes it.

Faults: a worker that dies mid-task (killed, out of memory, its node lost) is retried by Ray
up to ``max_retries`` times; an error a shard raises is not retried (it would raise again) and
reaches the caller as the error it is, unwrapped from Ray's ``RayTaskError``.  Closing the
results early (an error, Ctrl-C) cancels every task still pending or running.  A worker whose
onnxq or onnxruntime version differs from the driver's refuses its shard: its statistics could
differ; one that cannot import a module the task refers to (onnxq, a user's metric) stops the
run with a :class:`ResourceError` that says what to install.  Sessions on a worker run on the
driver's device (on CUDA: the GPU Ray assigned to the task, when tasks ask for GPUs), with as
many threads as Ray gave the task CPUs.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
from collections.abc import Generator, Iterable
from typing import Any

from onnxq.errors import InternalError, OnnxqError, ResourceError, one_line
from onnxq.runtime import device
from onnxq.scale.executor import C, R, S, Setup, Task, W

_INSTALL = "pip install 'onnxq[ray]'"
_remote_run: Any = None  # the Ray remote function of _run, made once per process
_worker_state: dict[str, Any] = {}  # in a worker: the context's object id and its state


def _versions() -> tuple[str, str]:
    import onnxruntime

    from onnxq.version import __version__

    return __version__, onnxruntime.__version__


def _run(
    task: Task[W, S, R],
    setup: Setup[C, W],
    holder: list[Any],
    shard: S,
    settings: device.SessionSettings,
    versions: tuple[str, str],
) -> R:
    """One shard on a Ray worker (``holder``: the context's object ref, inside a list so that
    Ray does not fetch it for every task)."""
    import ray

    if _versions() != versions:
        node = ray.util.get_node_ip_address()
        raise ResourceError(
            f"the Ray worker on {node} runs onnxq {_versions()[0]} with onnxruntime "
            f"{_versions()[1]}, this driver onnxq {versions[0]} with onnxruntime {versions[1]}: "
            "install the same versions on every node (statistics could differ)"
        )
    key = holder[0].hex()
    if _worker_state.get("key") != key:
        _worker_state.clear()  # the previous model goes before the next one is read
        _worker_state.update(key=key, state=setup(ray.get(holder[0])))
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
    threads = max(1, math.floor(cpus)) if cpus else 0
    place = settings.device
    if place != "cpu" and ray.get_gpu_ids():  # Ray shows the task only the GPU it assigned
        place = "cuda"
    with device.using(device.SessionSettings(place, threads)):
        return task(_worker_state["state"], shard)


class RayExecutor:
    """Shards as Ray tasks (see the module docstring).

    ``address``: ``auto`` (the cluster this machine belongs to, e.g. after ``ray start``), a
    cluster address (``host:port``, ``ray://host:10001``), or ``local`` (start Ray on this
    machine, with ``local_cpus`` CPUs; None: all).  When this process is already connected to
    Ray (``ray.init`` was called), that connection is used.  ``num_cpus`` / ``num_gpus``: what
    each task asks of Ray; ``shard_batches``: batches per shard of calibration data (None:
    about four shards per parallel task); ``max_retries``: how often a task whose worker died
    is run again.  Connects at the first use; :meth:`close` (or the ``with`` block's end)
    disconnects when this executor connected.
    """

    def __init__(
        self,
        address: str = "auto",
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        shard_batches: int | None = None,
        max_retries: int = 3,
        local_cpus: int | None = None,
    ) -> None:
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self._shard_batches, self.max_retries, self.local_cpus = (
            shard_batches,
            max_retries,
            local_cpus,
        )
        self._connected = self._owns = False
        self._contexts: dict[int, tuple[Any, Any]] = {}  # id(context) -> (context, object ref)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def shard_batches(self) -> int | None:
        """Batches per shard (None: the caller decides from :attr:`parallelism`)."""
        return self._shard_batches

    @property
    def parallelism(self) -> int:
        """How many tasks the cluster runs at once, from its CPUs (and GPUs)."""
        ray = self._ray()
        resources = ray.cluster_resources()
        fits = int(resources.get("CPU", 1.0) // self.num_cpus) if self.num_cpus else 1
        if self.num_gpus:
            fits = min(fits, int(resources.get("GPU", 0.0) // self.num_gpus))
        return max(1, fits)

    def close(self) -> None:
        """Drop the contexts from the object store; disconnect if this executor connected."""
        self._contexts.clear()
        if self._owns:
            import ray

            ray.shutdown()
        self._connected = self._owns = False

    def map(
        self, task: Task[W, S, R], setup: Setup[C, W], context: C, shards: Iterable[S]
    ) -> Generator[R, None, None]:
        """``task(setup(context), shard)`` for each shard as Ray tasks, results in order."""
        ray = self._ray()
        if id(context) not in self._contexts:
            self._contexts[id(context)] = (context, ray.put(context))
        holder = [self._contexts[id(context)][1]]
        run = _remote(ray).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=self.max_retries
        )
        limit = 2 * self.parallelism
        pending: collections.deque[Any] = collections.deque()
        settings, versions = device.current(), _versions()
        try:
            for shard in shards:
                pending.append(run.remote(task, setup, holder, shard, settings, versions))
                while len(pending) >= limit:
                    yield self._result(pending.popleft())
            while pending:
                yield self._result(pending.popleft())
        finally:
            _cancel(ray, list(pending))  # an error, Ctrl-C or an early close: stop the rest

    def _result(self, ref: Any) -> Any:
        """The result of a task, or the error it raised, unwrapped from Ray's."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if (missing := _missing_module(cause)) is not None:
                raise _cannot_import(missing) from None
            if isinstance(cause, ray.exceptions.RayError):
                raise self._lost(cause) from None
            if isinstance(cause, (OnnxqError, InternalError)):
                raise cause.with_traceback(None) from None
            raise InternalError(
                f"a Ray task of onnxq failed: {type(cause).__name__}: {one_line(cause)}"
            ) from exc
        except ray.exceptions.RayError as exc:
            if (missing := _missing_module(exc)) is not None:
                raise _cannot_import(missing) from None
            raise self._lost(exc) from None

    def _lost(self, exc: BaseException) -> ResourceError:
        return ResourceError(
            f"Ray could not run a shard ({type(exc).__name__}: {one_line(exc)}); a task "
            f"whose worker dies is retried {self.max_retries} times: check the workers' memory "
            "(each holds the model and one session) and the cluster (ray status)"
        )

    def _ray(self) -> Any:
        """The ray module, connected."""
        try:
            import ray
        except ImportError:
            raise ResourceError(f"running on Ray needs the ray package: {_INSTALL}") from None
        if self._connected:
            return ray
        if not ray.is_initialized():
            self._init(ray)
            self._owns = True
        self._connected = True
        return ray

    def _init(self, ray: Any) -> None:
        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        try:
            if self.address == "local":
                ray.init(num_cpus=self.local_cpus, include_dashboard=False, **options)
            else:
                ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            hint = (
                "start one with `ray start --head`, or run on this machine with --ray local"
                if self.address == "auto"
                else "check the address (ray status prints it on the head node)"
            )
            raise ResourceError(
                f"cannot connect to the Ray cluster at {self.address}: {one_line(exc)}; {hint}"
            ) from None


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel ``refs`` and collect what they end with (most: cancelled), so that Ray does
    not log the errors of results nobody read; waits a few seconds at most."""
    for ref in refs:
        ray.cancel(ref, force=True)
    if not refs:
        return
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
    for ref in done:
        with contextlib.suppress(Exception):
            ray.get(ref, timeout=0)


def _missing_module(exc: BaseException | None) -> ModuleNotFoundError | None:
    """The missing module behind ``exc``: raised by the task, or by unpickling what the task
    carries (Ray wraps that in a ``RaySystemError``)."""
    for _ in range(4):
        if exc is None or isinstance(exc, ModuleNotFoundError):
            return exc
        exc = getattr(exc, "client_exc", None) or getattr(exc, "cause", None)
    return None


def _cannot_import(missing: ModuleNotFoundError) -> ResourceError:
    name = missing.name or str(missing)
    if "onnxq" in name:
        return ResourceError(
            f"a Ray worker cannot import onnxq ({missing}): install onnxq, the same version as "
            "here, on every node of the cluster"
        )
    return ResourceError(
        f"a Ray worker cannot import the module {name!r} that its task refers to (an accuracy "
        "target's metric, say): install it on every node of the cluster, the same version as "
        "here, or define the metric in a module the workers have"
    )


def _remote(ray: Any) -> Any:
    global _remote_run
    if _remote_run is None:
        _remote_run = ray.remote(_run)
    return _remote_run
