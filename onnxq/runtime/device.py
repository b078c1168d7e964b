"""Where onnxq's onnxruntime sessions run: on the CPU or on a CUDA device, with how many threads.

Every calibration and validation session takes its execution providers and its thread count
from here (:func:`providers`, :func:`configure`), so a run on a GPU changes nothing else and a
test can force either path.  The settings hold for a block (:func:`using`): the pipeline enters
the run's ``device`` (``QuantConfig.device``), a Ray worker the threads Ray gave its task.

``cuda`` needs onnxruntime's CUDA execution provider (the ``onnxruntime-gpu`` package) and a
CUDA device; :func:`check_device` says which one is missing before a run starts, and a session
that came up without the CUDA provider anyway is refused (:func:`confirm`): onnxruntime would
otherwise fall back to the CPU without a word.  The CPU path is the same as without this
module: ``CPUExecutionProvider`` and onnxruntime's default threads.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from onnxq.errors import ConfigError, ResourceError

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
_DEVICE = re.compile(r"cpu|cuda(?::(\d+))?")
_INSTALL = (
    "install onnxruntime-gpu in place of onnxruntime (pip uninstall onnxruntime; pip install "
    "onnxruntime-gpu) with the CUDA and cuDNN it needs, or use --device cpu"
)


@dataclass(frozen=True)
class SessionSettings:
    """``device``: ``cpu``, ``cuda`` or ``cuda:N``; ``threads``: onnxruntime's intra-op
    threads per session (0: onnxruntime's default, one per physical core)."""

    device: str = "cpu"
    threads: int = 0


_CPU = SessionSettings()  # frozen: safe to share as the default
_CURRENT: contextvars.ContextVar[SessionSettings] = contextvars.ContextVar(
    "onnxq_session_settings", default=_CPU
)


def is_device(device: str) -> bool:
    """Whether ``device`` names a device: ``cpu``, ``cuda`` or ``cuda:N``."""
    return _DEVICE.fullmatch(device) is not None


def parse_device(device: str) -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", N)`` for a device name; a :class:`ConfigError` else."""
    match = _DEVICE.fullmatch(device)
    if match is None:
        raise ConfigError(f"device: unknown device {device!r}; valid: cpu, cuda, cuda:N")
    if device == "cpu":
        return "cpu", 0
    return "cuda", int(match.group(1) or 0)


def current() -> SessionSettings:
    """The settings sessions are made with now."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(settings: SessionSettings) -> Iterator[SessionSettings]:
    """Make sessions with ``settings`` inside the block."""
    parse_device(settings.device)
    token = _CURRENT.set(settings)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)


def providers() -> list[Any]:
    """The execution providers of a session made now: the CPU's, or CUDA's first (the CPU
    running what CUDA does not)."""
    kind, index = parse_device(current().device)
    if kind == "cpu":
        return [CPU_PROVIDER]
    return [(CUDA_PROVIDER, {"device_id": index}), CPU_PROVIDER]


def configure(options: Any) -> dict[str, Any]:
    """Apply the current settings to onnxruntime ``SessionOptions``; returns the keyword
    arguments for ``InferenceSession`` (on CUDA: no silent fallback to the CPU)."""
    settings = current()
    if settings.threads > 0:
        options.intra_op_num_threads = settings.threads
    if parse_device(settings.device)[0] == "cpu":
        return {}
    options.use_deterministic_compute = True  # the same run twice gives the same statistics
    return {"enable_fallback": 0}


def confirm(session: Any) -> Any:
    """``session``, refused with a :class:`ResourceError` when the current device is CUDA and
    onnxruntime did not start its CUDA provider for it."""
    kind, index = parse_device(current().device)
    if kind == "cuda" and CUDA_PROVIDER not in session.get_providers():
        raise ResourceError(
            f"--device cuda:{index}: onnxruntime started the session without its CUDA "
            f"execution provider (it runs on {', '.join(session.get_providers())}); check "
            "that a CUDA device is visible (nvidia-smi, CUDA_VISIBLE_DEVICES), or use "
            "--device cpu"
        )
    return session


def check_device(device: str) -> None:
    """Raise a :class:`ResourceError` that names what is missing when ``device`` cannot run
    sessions here: onnxruntime's CUDA provider (a CPU build of onnxruntime), or a CUDA device
    that the provider can start on."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return
    import onnxruntime as ort

    available = ort.get_available_providers()
    if CUDA_PROVIDER not in available:
        raise ResourceError(
            f"--device {device}: this onnxruntime ({ort.__version__}) has no CUDA execution "
            f"provider (it offers {', '.join(available)}); {_INSTALL}"
        )
    with using(SessionSettings(device)):
        _start_probe(device, index)


def _start_probe(device: str, index: int) -> None:
    """Start a one-node session on CUDA device ``index``: the provider's own error when it
    cannot (no device, a CUDA or cuDNN mismatch)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    kwargs = configure(opts)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            session = ort.InferenceSession(
                onnx.ModelProto.SerializeToString(model), opts, providers=providers(), **kwargs
            )
    except Exception as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ResourceError(
            f"--device {device}: onnxruntime cannot start its CUDA execution provider on "
            f"device {index}: {reason}; check that a CUDA device is visible (nvidia-smi, "
            "CUDA_VISIBLE_DEVICES) and that CUDA and cuDNN match onnxruntime-gpu's, or use "
            "--device cpu"
        ) from None
    confirm(session)
