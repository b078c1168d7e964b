"""Running a model for validation: the session (Q/DQ fusion on or off, on the chosen device),
its outputs on held batches, and the padding masks that keep padded positions out of a
comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import Batch
from onnxq.errors import InternalError, UnsupportedModelError, one_line
from onnxq.runtime import device
from onnxq.runtime.heap import release_free_memory


def padding_masks(batches: list[dict[str, Any]]) -> list[np.ndarray | None]:
    """Per batch, its padding mask: an integer or bool input of rank 2 named like
    ``attention_mask`` ([batch, sequence], 0 = padding), else None."""
    masks: list[np.ndarray | None] = []
    for batch in batches:
        found = None
        for name in sorted(batch):
            value = batch[name]
            if (
                "mask" in name.lower()
                and isinstance(value, np.ndarray)
                and value.ndim == 2
                and value.dtype.kind in "iub"
            ):
                found = value != 0
                break
        masks.append(found)
    return masks


def unpadded(
    arrays: list[np.ndarray], masks: list[np.ndarray | None] | None
) -> tuple[list[np.ndarray], int]:
    """``arrays`` without their padded rows, when every batch has a mask that matches the
    output's two leading axes (and some row is padding); else unchanged."""
    if (
        not masks
        or len(masks) != len(arrays)
        or any(
            m is None or a.ndim < 3 or a.shape[:2] != m.shape
            for a, m in zip(arrays, masks, strict=True)
        )
    ):
        return arrays, 0
    dropped = sum(int((~m).sum()) for m in masks if m is not None)
    if dropped == 0:
        return arrays, 0
    return [a[m] for a, m in zip(arrays, masks, strict=True)], dropped


def validation_session(
    model: onnx.ModelProto, fused: bool, what: str = "quantized", ours: bool = False
) -> Any:
    """An onnxruntime session for ``model``, with Q/DQ fusion (all optimizations) or none, on
    the device of :mod:`onnxq.runtime.device` (by default the CPU).

    Nodes run in the model's priority order, not onnxruntime's default order: the default
    runs every weight's DequantizeLinear first, so an unfused model would hold all its weights
    dequantized to float at once (4x the int8 model) during each run.  ``ours``: the model is
    onnxq's output, so onnxruntime refusing it is an :class:`InternalError` (else the model's
    own :class:`UnsupportedModelError`).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures reach the user as onnxq errors, not as log lines
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if fused
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    with ir.scratch_dir() as workdir:
        payload = ir.session_bytes_or_path(model, workdir)
        placed = device.configure(opts)
        try:
            session = ort.InferenceSession(payload, opts, providers=device.providers(), **placed)
        except Exception as exc:
            message = f"onnxruntime cannot load the {what} model: {one_line(exc, 400)}"
            if ours:
                raise InternalError(message, onnxruntime_failed=True) from None
            raise UnsupportedModelError(message, onnxruntime_failed=True) from None
        return device.confirm(session)


def run_outputs(
    model: onnx.ModelProto | Any,
    batches: list[Batch],
    fused: bool,
    what: str,
    ours: bool = False,
) -> list[dict[str, np.ndarray]]:
    """Run ``model`` (a proto or a ready session) on ``batches``.

    A session made here is released before this returns (the caller's next session must not
    find this one's weights still in memory).  A failure is the model's
    (:class:`UnsupportedModelError`: the batches match its declared inputs, so the model
    does not run on such data in onnxruntime), or onnxq's when ``ours`` (its own output:
    :class:`InternalError`).
    """
    if not isinstance(model, onnx.ModelProto):
        return _run_all(model, batches, what, ours)
    session = validation_session(model, fused, what, ours)
    try:
        return _run_all(session, batches, what, ours)
    finally:
        del session
        release_free_memory()  # the float model's weights, freed but kept by the C library


def typed_feed(session: Any, batch: Batch) -> Batch:
    """``batch`` with each float array in the type ``session``'s input takes: an output whose
    graph inputs are FP16 (``keep_io_types: false``) is fed the FP32 data rounded to FP16."""
    half = {i.name for i in session.get_inputs() if i.type == "tensor(float16)"}
    if not half:
        return batch
    return {k: v.astype(np.float16) if k in half else v for k, v in batch.items()}


def _run_all(
    session: Any, batches: list[Batch], what: str, ours: bool
) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    results = []
    for i, batch in enumerate(batches):
        batch = typed_feed(session, batch)
        try:
            values = session.run(names, batch)
        except Exception as exc:
            message = f"the {what} model fails in onnxruntime on held batch {i}: {one_line(exc)}"
            if ours:
                raise InternalError(message, onnxruntime_failed=True) from None
            raise UnsupportedModelError(
                f"{message}; the batch matches the model's declared inputs, so the model itself "
                "does not run on such data in onnxruntime: check the float model on it",
                onnxruntime_failed=True,
            ) from None
        results.append(dict(zip(names, values, strict=True)))
    return results
