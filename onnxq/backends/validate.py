"""Run-time validation: the quantized model must load and run in onnxruntime, and its outputs
are compared with the float model's on held calibration batches.

For a TensorRT-targeted model, onnxruntime's Q/DQ fusion is switched off (``fused=False``): its
fused int8 CPU kernels saturate on CPUs without VNNI, while TensorRT computes what the Q/DQ graph
itself says.  For the onnxruntime backend the fused kernels are what the user runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxq.calibrate import make_session
from onnxq.data import Batch
from onnxq.errors import BackendConstraintError


@dataclass(frozen=True)
class OutputFidelity:
    """Agreement of one model output with the float model over the held batches."""

    name: str
    cosine: float
    max_abs_error: float
    float_max_abs: float


def run_outputs(model: onnx.ModelProto | Any, batches: list[Batch], fused: bool,
                what: str) -> list[dict[str, np.ndarray]]:
    """Run ``model`` (a proto or a ready session) on ``batches``."""
    session = model if not isinstance(model, onnx.ModelProto) else make_session(model, fused)
    names = [o.name for o in session.get_outputs()]
    results = []
    for i, batch in enumerate(batches):
        try:
            values = session.run(names, batch)
        except Exception as exc:
            raise BackendConstraintError(
                f"the {what} model fails in onnxruntime on held batch {i}: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from None
        results.append(dict(zip(names, values, strict=True)))
    return results


def fidelity(reference: list[dict[str, np.ndarray]],
             quantized: list[dict[str, np.ndarray]]) -> list[OutputFidelity]:
    """Cosine similarity and max absolute error per output, over all batches."""
    out = []
    for name in reference[0] if reference else []:
        ref = [np.asarray(r[name]) for r in reference]
        got = [np.asarray(q[name]) for q in quantized]
        if not all(np.issubdtype(r.dtype, np.floating) for r in ref):
            agree = np.mean([np.array_equal(r, g) for r, g in zip(ref, got, strict=True)])
            out.append(OutputFidelity(name, float(agree), 0.0, 0.0))
            continue
        a = np.concatenate([r.astype(np.float64).ravel() for r in ref])
        b = np.concatenate([g.astype(np.float64).ravel() for g in got])
        denom = float(np.linalg.norm(a) * np.linalg.norm(b))
        cos = float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        out.append(OutputFidelity(name, round(cos, 6), err, float(np.max(np.abs(a), initial=0))))
    return out
