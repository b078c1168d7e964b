"""Placement for dynamic quantization (``--dynamic``): no calibration pass.

The dynamic profile's rule set (``onnxq.rewrites.dynamic``) claims the ops that get
onnxruntime's dynamically quantized kernels; their activations are quantized by the kernels at
run time, so nothing is observed.  Calibration data, when given, only provides the held batches
the fidelity check compares the quantized model with the float one on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx

from onnxq import ir
from onnxq.annotate import Annotations, annotate
from onnxq.backends.profile import BackendProfile
from onnxq.calibrate import CalibrationResult, calibrate
from onnxq.config import QuantConfig


def place_dynamic(
    model: onnx.ModelProto,
    graph: ir.Graph,
    profile: BackendProfile,
    config: QuantConfig,
    data: Iterable[Any] | None,
    inputs: list[Any],
) -> tuple[Annotations, CalibrationResult]:
    """Annotate with the dynamic rule set; hold ``config.fidelity_batches`` batches of ``data``
    (if any) for the fidelity check.  The result holds no statistics."""
    held = []
    if data is not None and config.fidelity_batches:
        held = calibrate(
            model,
            {},
            data,
            inputs,
            max_batches=config.fidelity_batches,
            hold=config.fidelity_batches,
            progress=False,
        ).held
    annotations = annotate(graph, profile, config)
    annotations.notes.append(
        "dynamic quantization: weights int8 per output channel, stored ahead of time; "
        "activations quantized per tensor to uint8 by onnxruntime's kernels on each run "
        "(DynamicQuantizeMatMul, DynamicQuantizeLSTM), so no calibration data was needed"
    )
    return annotations, CalibrationResult({}, 0, held)
