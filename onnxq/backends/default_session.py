"""What onnxruntime's default session shows for an output that is validated unfused.

A TensorRT-targeted model is measured with onnxruntime's Q/DQ fusion off: that is the graph's
own arithmetic, what TensorRT computes.  The first thing most users do is to run it in
onnxruntime's default session, which fuses Q/DQ into int8 CPU kernels.  On x86 without int8 dot
products those kernels add pairs of products in saturating int16 sums, and signed int8
activations fill them (they run shifted by +128 as uint8), so the outputs can differ far beyond
quantization noise; and where no QuantizeLinear follows an op, onnxruntime runs it in float
behind a DequantizeLinear, so the model can run slower than the float one.  This module
measures both on this machine and returns the figures as data (``onnxq.validate.verify`` runs it;
``onnxq.report.fidelity`` says what they call for).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.cpu import this_machine
from onnxq.backends.runs import padding_masks, run_outputs, typed_feed
from onnxq.backends.validate import OutputFidelity, class_axes, fidelity
from onnxq.errors import UnsupportedModelError
from onnxq.runtime import device

# the fused error counts as beyond noise above NOISE_FACTOR x the unfused error plus this
NOISE_FACTOR = 1.5
NOISE_FLOOR = 0.002
TIMING_LIMIT_BYTES = 256 << 20  # larger float models are not timed (memory, time)
TIMING_PAIRS = 7  # interleaved float/quantized runs after one warm-up each
TIMING_BUDGET_S = 2.0  # the pairs stop early past this (a large model)

# a function that runs ``run`` and returns the seconds it took; ``label`` is "float" or
# "quantized" (tests replace it: timing in a unit test would be flaky)
Timer = Callable[[str, Callable[[], object]], float]


def perf_counter_timer(label: str, run: Callable[[], object]) -> float:
    """Wall-clock seconds of one ``run()``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@dataclass(frozen=True)
class FusedFidelity:
    """One output: its agreement with the float model fused and unfused."""

    name: str
    compared: str
    unfused: float  # cosine, or the share of equal values for an integer output
    fused: float
    unfused_top1: float | None = None
    fused_top1: float | None = None
    beyond_noise: bool = False


@dataclass(frozen=True)
class Latency:
    """Median milliseconds per held batch in onnxruntime's default session, one thread."""

    float_ms: float
    quantized_ms: float
    pairs: int

    @property
    def ratio(self) -> float:
        """Quantized over float time (> 1: the quantized model is slower)."""
        return self.quantized_ms / self.float_ms if self.float_ms > 0 else 1.0


@dataclass(frozen=True)
class DefaultSessionView:
    """The default session's figures on this machine (a machine of the class ``cpu``).

    ``outputs`` are deterministic on a machine and go into the report file; ``latency``
    changes from run to run, so it stays out of the report file (the same inputs reproduce it
    byte for byte) and only the terminal summary shows it.  ``failure``: why the default
    session could not run the model (its Q/DQ graph ran).
    """

    cpu: str
    outputs: tuple[FusedFidelity, ...] = ()
    latency: Latency | None = None
    failure: str | None = None

    @property
    def disagrees(self) -> bool:
        """Whether some output's fused figure is beyond the unfused one's noise."""
        return any(o.beyond_noise for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the report (the timing left out, see above)."""
        return {
            "cpu": self.cpu,
            "outputs": [dict(o.__dict__) for o in self.outputs],
            "differs_beyond_noise": self.disagrees,
            **({"failure": self.failure} if self.failure is not None else {}),
        }


def default_session_view(
    model: onnx.ModelProto,
    reference: list[dict[str, np.ndarray]],
    held: list[dict[str, np.ndarray]],
    unfused: list[OutputFidelity],
    float_model: bytes | None = None,
    timer: Timer | None = None,
) -> DefaultSessionView:
    """Run ``model`` (Q/DQ, validated unfused) in onnxruntime's default session on ``held``
    and compare with ``reference`` (the float outputs); with ``float_model`` (its serialized
    float original) also time both, interleaved, on the first held batch.  A model that the
    default session cannot load or run comes back with the reason in ``failure``."""
    cpu = this_machine().name
    try:
        # the default session on this machine's CPU, whatever the run's --device
        with device.using(device.SessionSettings("cpu")):
            quantized = run_outputs(model, held, True, "quantized")
    except UnsupportedModelError as exc:  # the Q/DQ graph ran: onnxruntime's fusion fails
        return DefaultSessionView(cpu, failure=str(exc))
    fused = fidelity(reference, quantized, class_axes(model), padding_masks(held))
    by_name = {f.name: f for f in fused}
    outputs = tuple(
        _compare(u, by_name[u.name]) for u in unfused if u.name in by_name and not u.selected_by
    )
    latency = None
    if float_model is not None and held:
        latency = time_default_sessions(float_model, model, held[0], timer or perf_counter_timer)
    return DefaultSessionView(cpu, outputs, latency)


def timing_copy(reference_bytes: bytes | None, model: onnx.ModelProto) -> bytes | None:
    """The serialized float model to time against, when ``model`` (the loaded float model) is
    small enough and holds all its weights (else None: not timed)."""
    if (
        reference_bytes is None
        or ir.external.has_lazy(model)
        or ir.model_nbytes(model) > TIMING_LIMIT_BYTES
    ):
        return None
    return reference_bytes


def _compare(unfused: OutputFidelity, fused: OutputFidelity) -> FusedFidelity:
    beyond = False
    if unfused.compared in ("cosine", "agreement") and fused.compared == unfused.compared:
        beyond = 1 - fused.cosine > NOISE_FACTOR * (1 - unfused.cosine) + NOISE_FLOOR
    return FusedFidelity(
        unfused.name,
        unfused.compared,
        unfused.cosine,
        fused.cosine,
        unfused.top1_agreement,
        fused.top1_agreement,
        beyond,
    )


def time_default_sessions(
    float_model: bytes, model: onnx.ModelProto, batch: dict[str, np.ndarray], timer: Timer
) -> Latency:
    """Median time of each model on ``batch`` in a default (fused), one-thread session; the
    two take turns, after one warm-up run each, for :data:`TIMING_PAIRS` pairs or until
    :data:`TIMING_BUDGET_S` have passed."""
    sessions = {
        "float": _one_thread(float_model),
        "quantized": _one_thread(ir.serialize(model)),
    }
    times: dict[str, list[float]] = {k: [] for k in sessions}
    spent = 0.0
    for i in range(TIMING_PAIRS + 1):
        for label, sess in sessions.items():
            seconds = timer(label, functools.partial(sess.run, None, typed_feed(sess, batch)))
            spent += seconds
            if i:  # the first pair warms up
                times[label].append(seconds)
        if spent > TIMING_BUDGET_S and i:
            break
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return Latency(med["float"], med["quantized"], len(times["float"]))


def _one_thread(payload: bytes) -> Any:
    """A default session (all optimizations: Q/DQ fused) on one intra-op thread."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(payload, opts, providers=["CPUExecutionProvider"])
