"""The small sections of a :class:`~onnxq.config.QuantConfig`: the backend profile, how weights
are stored, the accuracy target, the fidelity check and the run itself; with the values each
field allows.  The larger sections have modules of their own: :mod:`onnxq.config.placement`,
:mod:`onnxq.config.calibration`, :mod:`onnxq.config.recovery`,
:mod:`onnxq.config.weightonly`.

A section is a frozen dataclass whose fields are declared once, with their defaults and
checks (:func:`~onnxq.config.fields.option`); a stage takes the sections it reads, not the
whole config.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxq.backends.profile import BACKENDS
from onnxq.config.fields import (
    Section,
    check_cpu_class,
    check_target,
    must,
    one_of,
    option,
    share_of,
)
from onnxq.numerics.qparams import WEIGHT_METHODS
from onnxq.runtime.device import is_device

WEIGHT_STORAGE = ("int8", "qdq")  # how static weights are stored (``weight_storage``)
TARGET_COSTS = ("layers", "macs")  # what the accuracy target's search minimises


@dataclass(frozen=True)
class ProfileOptions(Section):
    """What chooses the run's backend profile (``onnxq.backends.target.profile_for``):
    the backend, dynamic quantization, and for onnxruntime the CPU class it is tuned for.

    Attributes:
        backend: ``tensorrt`` (symmetric int8, per-channel weights; the default) or
            ``onnxruntime`` (Q/DQ groups that onnxruntime's CPU kernels fuse).
        dynamic: dynamic quantization (onnxruntime backend): int8 weights written ahead of
            time; activations quantized at run time by onnxruntime's
            DynamicQuantizeMatMul / MatMulIntegerToFloat / DynamicQuantizeLSTM kernels.  No
            calibration data is needed (given, it only feeds the fidelity check).
        reduce_range: 7-bit int8 weights for the onnxruntime backend (its u8s8 CPU kernels
            saturate int16 sums on x86 CPUs without VNNI), or full-range int8 (False);
            ``None`` decides from ``target_cpu`` (uint8-stored 8-bit weights on ``x86-avx2``).
        target_cpu: the CPU class an onnxruntime output is tuned for (weight range, cost
            thresholds): ``x86-avx2``, ``x86-vnni``, ``arm64``, ``arm64-dot``, ``other``;
            ``None``: the ``ONNXQ_TARGET_CPU`` environment variable, else this machine's.
        cost_table: a cost-threshold table written by ``onnxq tune-cpu`` (JSON) to use instead
            of the shipped table of the target class.
    """

    backend: str = option("tensorrt", one_of(lambda: BACKENDS, "backend"))
    dynamic: bool = option(False)
    reduce_range: bool | None = option(None)
    target_cpu: str | None = option(None, lambda name, value: check_cpu_class(value, name))
    cost_table: str | None = option(None)


@dataclass(frozen=True)
class WeightOptions(Section):
    """How static weights are stored and their per-channel range chosen (materialize, bias
    correction).

    Attributes:
        weight_storage: ``int8`` (int8 initializer + DequantizeLinear) or ``qdq`` (float
            initializer + QuantizeLinear -> DequantizeLinear).
        weight_method: per-channel weight range: ``minmax`` (each channel's largest
            magnitude) or ``mse`` (the per-channel clip with the least squared error).
    """

    weight_storage: str = option("int8", one_of(lambda: WEIGHT_STORAGE, "weight storage"))
    weight_method: str = option("mse", one_of(lambda: WEIGHT_METHODS, "weight method"))


@dataclass(frozen=True)
class AccuracyOptions(Section):
    """An accuracy target and its search (``onnxq.mixed.search``).

    Attributes:
        target_accuracy: ``METRIC=VALUE`` (``cosine=0.999``; metrics in
            ``onnxq.numerics.accuracy_target.METRICS``): keep the fewest, most harmful layers float
            until the metric reaches VALUE on held-out batches (``onnxq.mixed.search``);
            ``None``: no search.
        heldout_batches: batches held out to measure the accuracy target: the first ones of
            the calibration data, which calibration then skips (at most a quarter of them),
            unless held-out data is given.
        target_cost: what the accuracy target's search minimises: ``layers`` (the fewest
            float layers, most sensitive first) or ``macs`` (the fewest multiply-adds left out
            of INT8: layers by gain per multiply-add; ``onnxq.mixed.float_cost``).
        target_max_float_macs: the most of the model's multiply-adds the accuracy target's
            search may leave out of INT8, a share (``0.1``, or ``"10%"``); the search keeps
            the best model within it and says when the target is missed
            (``onnxq.mixed.float_budget``); ``None``: no ceiling.
    """

    target_accuracy: str | None = option(None, lambda name, value: check_target(value, name))
    heldout_batches: int = option(16, must(lambda v: v >= 1, "be >= 1"))
    target_cost: str = option("layers", one_of(lambda: TARGET_COSTS, "cost"))
    target_max_float_macs: float | None = option(
        None,
        must(lambda v: 0 <= v <= 1, "be a share in [0, 1]"),
        also=(str,),
        parse=lambda value, _: share_of(value, "target_max_float_macs"),
    )


@dataclass(frozen=True)
class ValidateOptions(Section):
    """The fidelity check against the float model (``onnxq.validate``).

    Attributes:
        agreement_threshold: the fidelity check compares each sigmoid output of the model at
            this threshold too (the share of values on the same side in both models).
    """

    agreement_threshold: float = option(0.5)


@dataclass(frozen=True)
class RunOptions(Section):
    """The run itself: the simplify passes and the device its sessions run on.

    Attributes:
        simplify: run the simplify passes before placing Q/DQ.
        device: where the calibration and validation sessions run: ``cpu``, or ``cuda`` /
            ``cuda:N`` (onnxruntime's CUDA execution provider: the ``onnxruntime-gpu``
            package and a CUDA device; ``onnxq.runtime.device``).
    """

    simplify: bool = option(True)
    device: str = option("cpu", must(is_device, "be cpu, cuda or cuda:N"))


__all__ = [
    "TARGET_COSTS",
    "WEIGHT_METHODS",
    "WEIGHT_STORAGE",
    "AccuracyOptions",
    "ProfileOptions",
    "RunOptions",
    "ValidateOptions",
    "WeightOptions",
]
