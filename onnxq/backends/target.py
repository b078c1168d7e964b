"""The backend profile of one run: tuned for the CPU class the run targets (weight range and
cost thresholds), with the fields of its precision or of dynamic quantization, or a one-line
refusal when the backend cannot run what the config asks for.

Only a profile with ``cpu_tuned`` (onnxruntime) changes with the CPU; a TensorRT output is the
same on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from onnxq.backends.cost_tables import SHIPPED, CostTable
from onnxq.backends.cpu import CPU_CLASSES, TargetCpu, resolve_target
from onnxq.backends.profile import PROFILES, BackendProfile
from onnxq.errors import ConfigError
from onnxq.numerics.precisions import PRECISIONS


class TargetOptions(Protocol):
    """What choosing a run's profile reads (:class:`onnxq.config.options.ProfileOptions`, the
    config's profile section, provides it): the backend, the CPU class and cost table it is
    tuned for, the weight range, and whether activations are quantized at run time."""

    @property
    def backend(self) -> str: ...
    @property
    def reduce_range(self) -> bool | None: ...
    @property
    def target_cpu(self) -> str | None: ...
    @property
    def cost_table(self) -> str | None: ...
    @property
    def dynamic(self) -> bool: ...


# the opset a graph computing in FP16/BF16 needs: FP16/BF16 Q/DQ scales from 19 (ONNX
# QuantizeLinear-19: x and y_scale of one type, DequantizeLinear-19's output the scale's type);
# BF16 forms of Conv, Gemm and the normalisations from 22
HIGH_PRECISION_OPSET = {"fp16": 19, "bf16": 22}

# high precisions no run can take yet, and why: onnxq runs every output in onnxruntime
HIGH_PRECISION_REFUSALS = {
    "bf16": (
        "high_precision bf16: onnxq runs every output in onnxruntime to check and measure it, "
        "and onnxruntime's CPU provider has no BF16 DequantizeLinear (NOT_IMPLEMENTED): use "
        "fp16 (TensorRT's default; FP32 where the calibration data passes FP16's range) or fp32"
    ),
}


def profile_for(
    options: TargetOptions,
    precisions: Sequence[str] = ("int8",),
    high_precision: str | None = None,
) -> tuple[BackendProfile, str]:
    """The profile of a run: the backend's, tuned for the CPU class it targets, with the
    fields its precision (or ``dynamic``) changes; and a note on the weight range (empty when
    weights have their full range).  ``precisions``: the run's precision first, then those its
    overrides name (``PlacementOptions.precisions()``); ``high_precision``: what the float
    compute is written in (None: the backend's ``high_precision``).

    A :class:`ConfigError` when the backend cannot run a precision the options name, or has
    no dynamic quantization: raised before anything is loaded or written.  Everything here
    reads profile data (``precisions``, ``precision_refusals``, ``dynamic_changes``).
    """
    backend = PROFILES[options.backend]
    refusal = precision_refusal(backend, options, precisions)
    if refusal is not None:
        raise ConfigError(refusal)
    if options.dynamic:
        # the dynamic kernels' own weight types decide the weights' storage (tuned with them),
        # and their fields win over the cost table's
        dynamic = backend.dynamic_changes or {}
        profile, note = tune_profile(backend.replace(**dynamic), options)
        return profile.replace(**dynamic), note
    profile, note = tune_profile(backend, options)
    changes = dict(profile.precisions[precisions[0]])
    high = high_precision or profile.high_precision
    if high in HIGH_PRECISION_REFUSALS:
        raise ConfigError(HIGH_PRECISION_REFUSALS[high])
    if high != profile.high_precision:
        changes["high_precision"] = high
    # a precision an override names needs its opset too (FP8 Q/DQ: 19), and FP16 compute
    opsets = [profile.precisions[p].get("min_opset", 0) for p in precisions]
    opsets.append(HIGH_PRECISION_OPSET.get(high, 0))
    opset = max(profile.min_opset, *(o for o in opsets if isinstance(o, int)))
    if opset != profile.min_opset:
        changes["min_opset"] = opset
    return (profile.replace(**changes) if changes else profile), note


def precision_refusal(
    profile: BackendProfile, options: TargetOptions, precisions: Sequence[str] = ("int8",)
) -> str | None:
    """Why ``profile``'s backend cannot run the precisions (or the dynamic quantization)
    ``options`` ask for, in one line; None when it can."""
    for name in precisions:
        if name not in profile.precisions:
            why = profile.precision_refusals.get(
                name, f"{profile.name} has no {PRECISIONS[name].summary} kernels"
            )
            return f"precision {name} with --backend {profile.name}: {why}"
    if not options.dynamic:
        return None
    if profile.dynamic_changes is None:
        return f"--dynamic with --backend {profile.name}: {profile.dynamic_refusal}"
    others = [p for p in precisions if p != "int8"]
    if others:
        return (
            "--dynamic quantizes to int8 only (onnxruntime's dynamic kernels take 8-bit "
            f"inputs): drop precision {', '.join(others)}"
        )
    return None


def tune_profile(profile: BackendProfile, options: TargetOptions) -> tuple[BackendProfile, str]:
    """``profile`` for the target CPU class, and a note on the weights (empty: full-range int8).

    The class is ``options.target_cpu``, else the ``cpu`` of the ``cost_table`` file, else
    :func:`onnxq.backends.cpu.resolve_target`'s.  The cost thresholds come from ``cost_table``
    or the shipped table of the class; the weights' storage type or range from
    :func:`_weight_format`.
    """
    if not profile.cpu_tuned:
        return profile, ""
    target_cpu, cost_table = options.target_cpu, options.cost_table
    table = CostTable.from_file(cost_table) if cost_table is not None else None
    if table is not None and target_cpu is not None and table.cpu != target_cpu:
        raise ConfigError(
            f"cost_table {cost_table} was measured on the class {table.cpu} but target_cpu is "
            f"{target_cpu}; drop one of them, or run onnxq tune-cpu on a {target_cpu} machine"
        )
    target = resolve_target(target_cpu if table is None else table.cpu)
    if table is not None:
        target = TargetCpu(target.cpu, "cost_table")
    else:
        table = SHIPPED[target.name]
    changes: dict[str, Any] = {
        **table.thresholds(),
        "target_cpu": target.name,
        "cost_table": table.measured_on
        if cost_table is None
        else f"{Path(cost_table).name}: {table.measured_on}",
    }
    weights, note = _weight_format(profile, target, options.reduce_range)
    return profile.replace(**changes, **weights), note


def _weight_format(
    profile: BackendProfile, target: TargetCpu, reduce_range: bool | None
) -> tuple[dict[str, Any], str]:
    """The profile's weight fields for ``target``, and the warning on them (empty unless the
    range is reduced: :func:`describe_target` says what the storage type is).

    ``reduce_range`` unset: a class whose u8 x s8 kernels saturate gets its ``weight_dtype``
    (uint8: the same values, which the u8 x u8 kernels sum exactly) where the profile allows
    that type, else the profile's reduced range.  Set: the reduced range (True) or full-range
    int8 (False), whatever the class.
    """
    why = f"the target CPU class {target.name} ({_source(target)})"
    if reduce_range is None:
        dtype = target.cpu.weight_dtype
        if dtype != profile.weight_dtype and dtype in profile.stored_weight_dtypes:
            return {"weight_dtype": dtype}, ""  # the same numbers: nothing to warn about
        reduce_range = target.cpu.int16_pair_sums
    else:
        why = "reduce_range set in the config"
    if not reduce_range or profile.reduced_weight_qmax is None:
        return {}, ""
    changes: dict[str, Any] = {"weight_qmax": profile.reduced_weight_qmax}
    if profile.int32_depthwise:
        changes["depthwise_weight_qmax"] = profile.weight_qmax
    return changes, _weight_note(profile, why)


def _weight_note(profile: BackendProfile, why: str) -> str:
    """Why the weights have 7 bits, for the report."""
    depthwise = (
        f" (depthwise convs keep +-{profile.weight_qmax}: that kernel sums in int32)"
        if profile.int32_depthwise
        else ""
    )
    return (
        f"weights limited to +-{profile.reduced_weight_qmax} (7-bit): {why}; onnxruntime's "
        "u8 x s8 kernels on x86 without int8 dot products (VNNI) add pairs of products in "
        f"int16, which full-range weights overflow{depthwise}"
    )


def _source(target: TargetCpu) -> str:
    return {
        "config": "target_cpu in the config",
        "cost_table": "the cost table's",
        "this machine": "this machine's; --target-cpu chooses another",
    }.get(target.source, f"set by {target.source}")


def target_record(profile: BackendProfile) -> dict[str, Any]:
    """What the report says about the CPU class the output was tuned for (empty when the
    backend's output does not depend on it)."""
    if profile.target_cpu is None:
        return {}
    record: dict[str, Any] = {
        "class": profile.target_cpu,
        "description": CPU_CLASSES[profile.target_cpu].description,
        "weight_bits": profile.weight_qmax.bit_length() + 1,
        "cost_table": profile.cost_table,
    }
    if profile.depthwise_weight_qmax is not None:
        record["depthwise_weight_bits"] = profile.depthwise_weight_qmax.bit_length() + 1
    if profile.weight_dtype != "int8":
        record["weight_dtype"] = profile.weight_dtype
    return record


def describe_target(record: dict[str, Any]) -> str:
    """One line for the summary from :func:`target_record`'s record."""
    depthwise = (
        f", depthwise convs {record['depthwise_weight_bits']}-bit"
        if "depthwise_weight_bits" in record
        else ""
    )
    stored = (
        f" stored as {record['weight_dtype']} (onnxruntime's u8 x u8 kernels, which sum them "
        "exactly where its u8 x s8 ones saturate)"
        if "weight_dtype" in record
        else ""
    )
    return (
        f"tuned for CPU class {record['class']}: {record['weight_bits']}-bit weights{stored}"
        f"{depthwise}; "
        f"cost thresholds: {record['cost_table']}"
    )


def target_mismatch(tuned: str | None, here: str) -> str | None:
    """What it means that a model tuned for the CPU class ``tuned`` (its metadata's record,
    ``onnxq.materialize.qdq.read_target_cpu``) runs on a machine of the class ``here``
    (:func:`onnxq.backends.cpu.this_machine`); None when they match or none was recorded."""
    if tuned is None or tuned == here or tuned not in CPU_CLASSES:
        return None
    was, now = CPU_CLASSES[tuned], CPU_CLASSES[here]
    head = f"this model was tuned for CPU class {tuned}, this machine is {here}"
    redo = f"quantize it again with --target-cpu {here} (or on this machine)"
    if now.int16_pair_sums and not was.int16_pair_sums:
        return (
            f"{head}: its weights use the full int8 range, and onnxruntime's u8 x s8 kernels "
            "here (no int8 dot products) add pairs of products in int16 sums that such weights "
            f"overflow, so its outputs can be far from what it computes on {tuned}; {redo} "
            f"for weights stored as {now.weight_dtype}, which its u8 x u8 kernels sum in int32"
        )
    if was.int16_pair_sums and not now.int16_pair_sums:
        return (
            f"{head}: it runs correctly here, but its weights are stored as {was.weight_dtype} "
            f"(what {tuned} needs), which onnxruntime runs in its slower u8 x u8 kernels "
            f"instead of its u8 x s8 ones, and its int8-or-float choices follow {tuned}'s cost "
            f"table; {redo} for {now.weight_dtype} weights and this class's choices"
        )
    return (
        f"{head}: its int8-or-float choices follow {tuned}'s cost table, so it may run "
        f"slower here than it could; {redo}"
    )
