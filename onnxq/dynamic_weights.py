"""The scales of the weights onnxruntime's dynamic matrix kernels multiply by: per column, or one
for the whole weight where that rounds it as well as the kernel needs.

``DynamicQuantizeMatMul`` and ``MatMulIntegerToFloat`` take a per-column weight scale, but run
it slower than a single one: the per-column path of their output stage costs 10-20% of the
kernel's time (the profile's ``tensor_scale_sqnr`` says where it was measured).  The activation
the kernel quantizes at run time (uint8, one scale per call, from its own min/max) bounds what
a finer weight scale can win: once a single scale rounds the weight with a signal-to-noise ratio
(SQNR) far above the activation's, per-column scales buy fidelity nobody sees, at a measurable
cost.  A weight with loud columns (a per-tensor SQNR of 8-25 dB, as BERT's FFN output
projections have) keeps per-column scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxq.observers import QParams, quantize_weight, weight_qparams


@dataclass(frozen=True)
class KernelWeights:
    """How the dynamic kernels' weights are quantized.

    Attributes:
        qmax: the largest integer magnitude (127; 63 where the target CPU's kernels add
            int16 pairs).
        method: the weight method (``minmax``, ``mse``).
        tensor_scale_sqnr: the SQNR in dB at or above which a [K, N] weight takes one scale
            (``None``: per column always).
    """

    qmax: int
    method: str
    tensor_scale_sqnr: float | None = None

    def matrix_qparams(self, weight: np.ndarray) -> QParams:
        """The qparams of a [K, N] weight: one scale where it rounds the weight well enough
        (:func:`rounding_sqnr` >= ``tensor_scale_sqnr``), else one per column (axis 1)."""
        if self.tensor_scale_sqnr is not None:
            whole = weight_qparams(weight, None, self.qmax, self.method)
            if rounding_sqnr(weight, whole, self.qmax) >= self.tensor_scale_sqnr:
                return whole
        return weight_qparams(weight, 1, self.qmax, self.method)


def rounding_sqnr(weight: np.ndarray, qp: QParams, qmax: int) -> float:
    """The signal-to-noise ratio in dB of ``weight`` rounded under ``qp`` (inf when exact)."""
    w = np.asarray(weight, dtype=np.float64)
    scale = np.asarray(qp.scale, dtype=np.float64)
    if qp.axis is not None:
        shape = [1] * w.ndim
        shape[qp.axis] = -1
        scale = scale.reshape(shape)
    error = w - quantize_weight(weight, qp, qmax).astype(np.float64) * scale
    noise, signal = float(np.square(error).sum()), float(np.square(w).sum())
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(max(signal, np.finfo(np.float64).tiny) / noise))
