"""The onnxruntime sessions of calibration: building them (the observed tensors exposed as
outputs, or their per-channel maxima taken inside the graph), keeping the last one for the next
shard, and running them on a batch, with onnxruntime's failures as onnxq errors that say whose
fault they are (:func:`blamed_error`).  The engine that uses them is :mod:`onnxq.calibrate.engine`.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.calibrate.plan import PeaksPlan
from onnxq.data.inputs import Batch
from onnxq.errors import InternalError, UnsupportedModelError, one_line
from onnxq.runtime import device


def make_session(
    model: onnx.ModelProto,
    optimize: bool = True,
    workdir: Path | None = None,
    spinning: bool = False,
):
    """An onnxruntime session for ``model`` (external data for huge models), on the device
    and with the threads of :mod:`onnxq.runtime.device` (by default: the CPU, onnxruntime's
    threads).

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


def peaks_session(
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


def blamed_error(
    model: onnx.ModelProto, batch: Batch | None, error: UnsupportedModelError
) -> Exception:
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


class OutputBuffers:
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
    is at least two batches back, and a batch's statistics are done
    (:meth:`onnxq.calibrate.batch.BatchWork.finish`) before the batch after it runs.  The
    first batch runs unbound and gives the outputs' shapes and types; a batch whose inputs
    differ in shape or type from the first runs unbound, and so does every batch once
    onnxruntime refuses the bound buffers (an output whose shape depends on the data, say).
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
