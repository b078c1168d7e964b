"""The last stage: prove the quantized model valid for its backend and measure its fidelity.

The constraint checker must find nothing (onnxq placed every Q/DQ: a violation is onnxq's
bug, an :class:`InternalError`); onnxruntime must load and run the model on the held batches
(same); its outputs are compared with the float model's.  A model validated unfused (the Q/DQ
graph's own arithmetic, what TensorRT computes) also runs in onnxruntime's default, fused,
session on this machine (``onnxq.backends.default_session``): what most users run first.  What
the comparisons found comes back as data (:class:`Verification`); ``onnxq.report.messages`` says
what deserves a warning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import onnx

from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.default_session import DefaultSessionView, default_session_view, timing_copy
from onnxq.backends.output_kinds import output_kinds
from onnxq.backends.profile import BackendProfile
from onnxq.backends.runs import padding_masks, run_outputs
from onnxq.backends.validate import OutputFidelity, class_axes, fidelity, selected_outputs
from onnxq.data.inputs import Batch
from onnxq.errors import InternalError

Unmeasured = Literal["no batches held", "no batches held (dynamic)", "no float copy"]

# how the quantized model runs for the fidelity check, by what the profile says
FIDELITY_MODES = {
    "dynamic": "onnxruntime's default session: its dynamic int8 kernels",
    "fused": "onnxruntime, Q/DQ fused into int8 kernels",
    "unfused": "onnxruntime, fusion off: the Q/DQ graph's own arithmetic",
}


def fidelity_mode(profile: BackendProfile) -> str:
    """How a model quantized for ``profile`` is run to measure its fidelity, in words."""
    if profile.dynamic:
        return FIDELITY_MODES["dynamic"]
    return FIDELITY_MODES["fused" if profile.fused_validation else "unfused"]


def compares_default_session(profile: BackendProfile) -> bool:
    """Whether a model validated unfused is also run in onnxruntime's default session (not
    where that session computes the profile's Q/DQ wrong: FP8)."""
    return not profile.fused_validation and profile.compare_default_session


@dataclass(frozen=True)
class Verification:
    """How the quantized model was run (``mode``), its fidelity per output, why fidelity was
    not measured (``unmeasured``), if it was not, and what onnxruntime's default session shows
    for a model validated unfused (``default_session``; None: not run)."""

    mode: str
    fidelity: list[OutputFidelity]
    unmeasured: Unmeasured | None = None
    default_session: DefaultSessionView | None = None


@dataclass(frozen=True)
class FloatReference:
    """The float model's outputs on the held batches (None: no float copy was kept), and the
    float model itself where the quantized one is timed against it (None: not timed)."""

    outputs: list[dict[str, Any]] | None
    timing_model: bytes | None = None


def float_reference(
    reference: bytes | None, model: onnx.ModelProto, held: list[Batch], profile: BackendProfile
) -> FloatReference:
    """The float model's outputs on the held batches, from ``reference`` (its serialization;
    None: no float copy was kept), and the copy to time in onnxruntime's default session when
    ``model`` (the loaded float model) is validated unfused and small enough.

    The float reference runs like the quantized model (fusion on or off), so an onnxruntime
    optimizer quirk on the float graph cannot pass for quantization error.
    """
    if reference is None or not held:
        return FloatReference(None)
    outputs = run_outputs(onnx.load_from_string(reference), held, profile.fused_validation, "float")
    timed = timing_copy(reference, model) if compares_default_session(profile) else None
    return FloatReference(outputs, timed)


def verify(
    model: onnx.ModelProto,
    reference: FloatReference,
    held: list[Batch],
    profile: BackendProfile,
    threshold: float = 0.5,
) -> Verification:
    """Check ``model`` (onnxq's output) against ``profile`` and compare it with the float
    model's outputs ``reference`` on ``held`` (sigmoid outputs also at ``threshold``)."""
    violations = check(model, profile)
    if violations:
        raise InternalError(
            f"the quantized model breaks {len(violations)} {profile.name} constraint(s), first: "
            f"{violations[0]}"
        )
    mode = _mode(model, profile)
    if not held:
        return Verification(
            mode, [], "no batches held (dynamic)" if profile.dynamic else "no batches held"
        )
    quantized = run_outputs(model, held, profile.fused_validation, "quantized", ours=True)
    if reference.outputs is None:
        return Verification(mode, [], "no float copy")
    selected = selected_outputs(model)
    outputs = [
        dataclasses.replace(f, selected_by=selected.get(f.name))
        for f in fidelity(
            reference.outputs,
            quantized,
            class_axes(model),
            padding_masks(held),
            output_kinds(model, threshold),
        )
    ]
    fused = None  # the default session fuses activation Q/DQ into int8 kernels: a model
    # with quantized activations only (weight-only DequantizeLinear becomes MatMulNBits there)
    if compares_default_session(profile) and any(
        n.op_type == "QuantizeLinear" for n in model.graph.node
    ):
        fused = default_session_view(
            model, reference.outputs, held, outputs, reference.timing_model
        )
    return Verification(mode, outputs, default_session=fused)


def _mode(model: onnx.ModelProto, profile: BackendProfile) -> str:
    """How onnxruntime ran ``model``, in words: a Q/DQ model (:func:`fidelity_mode`), or a
    weight-only one (integer weights, no QuantizeLinear)."""
    ops = {n.op_type for n in ir.every_node(model.graph)}
    if profile.dynamic or "QuantizeLinear" in ops or not ops & (ir.QDQ_OPS | ir.WEIGHT_ONLY_OPS):
        return fidelity_mode(profile)
    return (
        "onnxruntime with its optimizations: the weight-only kernels users run"
        if profile.fused_validation
        else "onnxruntime, optimizations off: the DequantizeLinear graph's own arithmetic"
    )
