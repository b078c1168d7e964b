"""The scales of the weights onnxruntime's dynamic matrix kernels multiply by: per column, or one
for the whole weight where that rounds it as well as the kernel needs.

``DynamicQuantizeMatMul`` and ``MatMulIntegerToFloat`` take a per-column weight scale, but run
it slower than a single one: the per-column path of their output stage costs 10-20% of the
kernel's time (the profile's ``tensor_scale_sqnr`` says where it was measured).  The activation
the kernel quantizes at run time (uint8, one scale per call, from its own min/max) bounds what
a finer weight scale can win: once a single scale rounds the weight with a signal-to-noise ratio
(SQNR) far above the activation's in every column, per-column scales buy fidelity nobody sees,
at a measurable cost.  The worst column decides: a weight with a few loud columns rounds its
quiet ones coarsely under one scale, however good its SQNR as a whole.
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
        tensor_scale_sqnr: a [K, N] weight takes one scale where that rounds every column
            with at least this signal-to-noise ratio in dB (``None``: per column always).
    """

    qmax: int
    method: str
    tensor_scale_sqnr: float | None = None

    def matrix_qparams(self, weight: np.ndarray) -> QParams:
        """The qparams of a [K, N] weight: one scale where it rounds every column well enough
        (:func:`column_sqnr` >= ``tensor_scale_sqnr``), else one per column (axis 1)."""
        if self.tensor_scale_sqnr is not None:
            whole = weight_qparams(weight, None, self.qmax, self.method)
            if column_sqnr(weight, whole, self.qmax).min() >= self.tensor_scale_sqnr:
                return whole
        return weight_qparams(weight, 1, self.qmax, self.method)


def column_sqnr(weight: np.ndarray, qp: QParams, qmax: int) -> np.ndarray:
    """Each column's signal-to-noise ratio in dB, ``weight`` [K, N] rounded under ``qp`` (inf
    for a column rounded exactly)."""
    w = np.asarray(weight, dtype=np.float64)
    scale = np.asarray(qp.scale, dtype=np.float64)
    if qp.axis is not None:
        shape = [1] * w.ndim
        shape[qp.axis] = -1
        scale = scale.reshape(shape)
    error = w - quantize_weight(weight, qp, qmax).astype(np.float64) * scale
    noise, signal = np.square(error).sum(axis=0), np.square(w).sum(axis=0)
    with np.errstate(divide="ignore"):
        ratio = np.where(noise > 0, signal / np.where(noise > 0, noise, 1.0), np.inf)
        return 10.0 * np.log10(np.maximum(ratio, np.finfo(np.float64).tiny))
