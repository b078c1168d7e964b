"""What the layer-by-layer recovery steps (sequential bias correction, sequential AdaRound) run:
onnxruntime sessions of a model pruned to one tensor, and the error of a model's outputs against
the float model's on the calibration batches."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.runs import padding_masks
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.errors import InternalError, UnsupportedModelError, one_line

LAYER_STEPS = "a layer-by-layer recovery step (sequential correction or AdaRound)"


class OutputDrift:
    """How far a model's outputs drift from the float model's on the calibration batches:
    per output, the sum of squared differences over the sum of squared float values, summed
    over the outputs; padded positions (a batch's ``attention_mask``-like input, see
    :func:`without_padding`) do not count.  The float outputs are kept for the batches that
    fit ``memory_budget`` (at least one); only those batches are scored.  ``every=(n, r)``:
    only the batches whose index is ``r`` modulo ``n``."""

    def __init__(
        self,
        original: onnx.ModelProto,
        data: Iterable[Batch],
        inputs: list[InputSpec],
        max_batches: int | None,
        memory_budget: int,
        every: tuple[int, int] = (1, 0),
    ) -> None:
        session = pruned_session(original, None, "float")
        self._batches: list[Batch] = []
        self._reference: list[list[np.ndarray]] = []
        self._padding: list[np.ndarray | None] = []
        used = 0
        for index, raw in enumerate(data):
            if max_batches is not None and index >= max_batches:
                break
            if index % every[0] != every[1]:
                continue
            batch = check_batch(raw, inputs, index)
            outputs = run_session(session, None, batch, index)
            used += sum(o.nbytes for o in outputs)
            if self._batches and used > memory_budget:
                break
            self._batches.append(batch)
            self._reference.append(outputs)
            self._padding.append(padding_masks([batch])[0])

    def __call__(self, model: onnx.ModelProto) -> float:
        """The error of ``model`` (its outputs in the float model's order)."""
        session = pruned_session(model, None, "Q/DQ")
        squared: list[float] = []
        norms: list[float] = []
        for index, (batch, reference, padding) in enumerate(
            zip(self._batches, self._reference, self._padding, strict=True)
        ):
            for k, (raw, full) in enumerate(
                zip(run_session(session, None, batch, index), reference, strict=True)
            ):
                got, want = without_padding(raw, full, padding)
                if k == len(squared):
                    squared.append(0.0)
                    norms.append(0.0)
                squared[k] += float(np.square(got - want).sum())
                norms[k] += float(np.square(want).sum())
        return sum(s / n if n > 0 else s for s, n in zip(squared, norms, strict=True))


def without_padding(
    got: np.ndarray, want: np.ndarray, padding: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """``got`` and ``want`` with their padded positions set to 0 in both, where ``padding``
    (a batch's mask, [batch, sequence], False = padding,
    :func:`onnxq.backends.runs.padding_masks`) matches their two leading axes: what a padded
    position holds is noise, not error.  Unchanged otherwise."""
    if padding is None or want.ndim < 3 or want.shape[:2] != padding.shape:
        return got, want
    keep = padding.reshape(padding.shape + (1,) * (want.ndim - 2))
    return np.where(keep, got, 0.0), np.where(keep, want, 0.0)


def pruned_session(
    model: onnx.ModelProto,
    tensor: str | None,
    what: str,
    step: str = LAYER_STEPS,
) -> Any:
    """An unoptimized onnxruntime session of ``model``, pruned to compute ``tensor`` alone
    when given; one onnxruntime cannot load is onnxq's failure (``what`` copy, for ``step``)."""
    from onnxq.calibrate.session import make_session

    try:
        if tensor is None:
            return make_session(model, optimize=False)
        output = ir.Graph(model).value_info(tensor)
        with ir.pruned(model, [tensor]), ir.with_outputs(model, [output]) as view:
            return make_session(view, optimize=False)
    except UnsupportedModelError as exc:  # the float model itself loaded for calibration
        raise InternalError(
            f"onnxruntime cannot load onnxq's {what} copy of the model for {step}: {exc}",
            onnxruntime_failed=True,
        ) from None


def run_session(
    session: Any,
    tensor: str | None,
    batch: Batch,
    index: int,
    step: str = LAYER_STEPS,
    as_float64: bool = True,
) -> list[np.ndarray]:
    """``tensor`` (None: every output) on one batch, as float64 (``as_float64=False``: in the
    types the model gives them); a failure is onnxq's, for ``step``."""
    try:
        values = session.run([tensor] if tensor is not None else None, batch)
    except Exception as exc:  # the float model ran on this batch during calibration
        raise InternalError(
            f"onnxruntime fails on onnxq's copy of the model for {step} on calibration batch "
            f"{index}: {one_line(exc)}",
            onnxruntime_failed=True,
        ) from None
    if not as_float64:
        return [np.asarray(v) for v in values]
    return [np.asarray(v, dtype=np.float64) for v in values]
