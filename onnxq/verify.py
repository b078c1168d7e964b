"""The last stage: prove the quantized model valid for its backend and measure its fidelity.

The constraint checker must find nothing (onnxq placed every Q/DQ: a violation is onnxq's
bug, an :class:`InternalError`); onnxruntime must load and run the model on the held batches
(same); its outputs are compared with the float model's.  What the comparison found comes back
as data (:class:`Verification`); ``onnxq.messages`` says what deserves a warning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import onnx

from onnxq.backends.check import check
from onnxq.backends.profile import BackendProfile
from onnxq.backends.validate import (
    OutputFidelity,
    class_axes,
    fidelity,
    padding_masks,
    run_outputs,
    selected_outputs,
)
from onnxq.errors import InternalError
from onnxq.inputs import Batch

Unmeasured = Literal["no batches held", "no float copy"]


@dataclass(frozen=True)
class Verification:
    """How the quantized model was run (``mode``), its fidelity per output, and why fidelity
    was not measured (``unmeasured``), if it was not."""

    mode: str
    fidelity: list[OutputFidelity]
    unmeasured: Unmeasured | None = None


def float_outputs(
    reference: bytes | None, held: list[Batch], profile: BackendProfile
) -> list[dict[str, Any]] | None:
    """The float model's outputs on the held batches (None: no float copy was kept).

    The float reference runs like the quantized model (fusion on or off), so an onnxruntime
    optimizer quirk on the float graph cannot pass for quantization error.
    """
    if reference is None or not held:
        return None
    model = onnx.load_from_string(reference)
    return run_outputs(model, held, profile.fused_validation, "float")


def verify(
    model: onnx.ModelProto,
    reference: list[dict[str, Any]] | None,
    held: list[Batch],
    profile: BackendProfile,
) -> Verification:
    """Check ``model`` (onnxq's output) against ``profile`` and compare it with the float
    model's outputs ``reference`` on ``held``."""
    violations = check(model, profile)
    if violations:
        raise InternalError(
            f"the quantized model breaks {len(violations)} {profile.name} constraint(s), first: "
            f"{violations[0]}"
        )
    mode = (
        "onnxruntime, Q/DQ fused into int8 kernels"
        if profile.fused_validation
        else "onnxruntime, fusion off: the Q/DQ graph's own arithmetic"
    )
    if not held:
        return Verification(mode, [], "no batches held")
    quantized = run_outputs(model, held, profile.fused_validation, "quantized", ours=True)
    if reference is None:
        return Verification(mode, [], "no float copy")
    selected = selected_outputs(model)
    outputs = [
        dataclasses.replace(f, selected_by=selected.get(f.name))
        for f in fidelity(reference, quantized, class_axes(model), padding_masks(held))
    ]
    return Verification(mode, outputs)
