"""One row of ``onnxq analyze``: how one tensor of the quantized model agrees with the float
model's, accumulated and local (:func:`onnxq.analyze.compare.analyze` fills it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerError:
    """Agreement of one tensor between the float and the quantized model.

    ``cosine``, ``sqnr_db`` and ``relative_error`` are the *accumulated* error (everything
    before the tensor quantized, as the quantized model computes it); ``local_cosine`` and
    ``local_sqnr_db`` the *local* error (the float model's inputs, quantized only from the
    last quantization boundary on: for a quantized op, its own inputs and weights).  For a
    quantized op, ``input_sqnr_db`` is its activation inputs' quantization noise (the worst
    input) and ``weight_sqnr_db`` its weight's (estimated from the scale: rounding noise of
    scale^2/12 per value); ``offset_share`` the part of the local error that is a constant
    offset per channel.  SQNR is in dB; None: no error (or no signal)."""

    tensor: str
    producer: str
    op_type: str
    cosine: float
    relative_error: float
    # values that are NaN/Inf in one model and not the same in the other (the cosine and the
    # error cover the values finite in both; equal non-finite values, a Log(0) in both, agree)
    nonfinite_mismatches: int = 0
    sqnr_db: float | None = None
    quantized: bool = False
    local_cosine: float | None = None
    local_sqnr_db: float | None = None
    input_sqnr_db: float | None = None
    weight_sqnr_db: float | None = None
    offset_share: float | None = None
    # per sample (an item along each batch's leading axis), accumulated: the worst cosine and
    # the indices (over all analyzed samples, in order) of the worst ones
    worst_sample_cosine: float | None = None
    worst_samples: tuple[int, ...] = ()
    advice: str | None = None
    # a quantized op that reads a never-negative activation on a symmetric int8 grid, unshifted:
    # half of the grid's steps are spent below 0 (``shift_activations`` gives them back)
    input_half_grid: bool = False
