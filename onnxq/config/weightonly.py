"""The weight-only section: the width, block size, algorithm and scheme of a weight-only run
(``onnxq.weightonly``), with the values each field allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxq.config.fields import Section, must, one_of, option

WEIGHT_ONLY = ("int4", "int8")  # the widths of ``--weights`` / ``weightonly.weight_only``
WEIGHT_ALGORITHMS = ("auto", "rtn", "gptq", "awq", "awq+gptq")


@dataclass(frozen=True)
class WeightOnlyOptions(Section):
    """A weight-only run's width, block size, algorithm and scheme.

    Attributes:
        weight_only: ``None`` (INT8 Q/DQ of weights and activations) or ``int4`` / ``int8``:
            weight-only quantization of MatMul/Gemm weights (and embedding tables where the
            backend runs them), activations untouched (docs/weight-only.md).
        block_size: weight-only: weights share a scale per block of this many input rows
            (``None``: 128 for int4, per channel for int8; 0: one scale per output channel);
            a backend without blocks for the width (TensorRT int8) uses per-channel scales.
        weight_algorithm: weight-only: ``rtn`` (round to nearest, error-minimising clip
            search), ``gptq``, ``awq``, ``awq+gptq``, or ``auto`` (the measured default:
            ``awq+gptq`` with calibration data, ``rtn`` without).
        weight_symmetric: weight-only: zero points fixed at 0 (TensorRT needs it) or an
            integer zero point per block (onnxruntime).
        weight_accuracy_level: weight-only, onnxruntime: MatMulNBits' ``accuracy_level``
            (0-4; 4 computes with int8 activations); ``None``: the measured default.
    """

    weight_only: str | None = option(None, must(lambda v: v in WEIGHT_ONLY, "be int4 or int8"))
    block_size: int | None = option(None, must(lambda v: v >= 0, "be >= 0 (0: per channel)"))
    weight_algorithm: str = option("auto", one_of(lambda: WEIGHT_ALGORITHMS, "algorithm"))
    weight_symmetric: bool = option(True)
    weight_accuracy_level: int | None = option(None, must(lambda v: 0 <= v <= 4, "be 0..4"))


__all__ = ["WEIGHT_ALGORITHMS", "WEIGHT_ONLY", "WeightOnlyOptions"]
