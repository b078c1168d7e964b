"""Weight-only quantization as one function: load, find the layers, choose their integer
weights (RTN, GPTQ, AWQ), write them (:mod:`onnxq.materialize_blocked`), check, measure, report.

Activations stay float.  Calibration data is optional: without it every layer is rounded to
nearest; with it the layers are quantized group by group on the inputs the already-quantized
model computes (:mod:`onnxq.weightonly.engine`).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES, BackendProfile
from onnxq.backends.validate import class_axes, fidelity, run_outputs
from onnxq.config import QuantConfig
from onnxq.data import Batch, model_inputs, open_source
from onnxq.errors import (
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    UnsupportedModelError,
)
from onnxq.materialize_blocked import WeightOnlyLayer, materialize_weight_only
from onnxq.weightonly.engine import Quantized, quantize_layers
from onnxq.weightonly.report import LayerRecord, WeightOnlyReport
from onnxq.weightonly.targets import Layer, find_layers

# measured defaults (docs/weight-only.md, scripts/bench_int4.py)
DEFAULT_ALGORITHM = "awq+gptq"  # smollm2 int4/128 proxy: gptq 21.02, awq+gptq 20.78 (act-order)
DEFAULT_BATCHES = 16  # calibration batches used when max_batches is not set
DEFAULT_ACCURACY_LEVEL = 4
FIDELITY_BATCHES = 1  # held batches (a float and a quantized pass; an LM's logits are large)


def quantize_weight_only(
    model: Any,
    calibration: Any,
    cfg: QuantConfig,
    batch_size: int = 1,
    save_calibration: Any = None,
    load_calibration: Any = None,
) -> Any:
    """Quantize the weights of ``model``'s MatMul/Gemm layers (``cfg.weights``); see
    :func:`onnxq.quantize`.  Returns a :class:`onnxq.api.QuantizedModel`."""
    from onnxq.api import QuantizedModel, load, refuse_quantized

    if save_calibration is not None or load_calibration is not None:
        raise ConfigError(
            "weight-only quantization keeps no calibration statistics: drop "
            "--save-calibration / --load-calibration"
        )
    profile = PROFILES[cfg.backend]
    fmt = profile.weight_only
    if fmt is None:
        raise ConfigError(f"backend {profile.name} runs no weight-only layers")
    check_block_size(cfg, profile)
    loaded, source = load(model, profile.replace(min_opset=_min_opset(cfg, profile)))
    refuse_quantized(loaded, source, profile)
    _refuse_weight_only(loaded)
    ir.drop_initializer_inputs(loaded)
    layers, skipped = find_layers(loaded, profile, cfg)
    if not layers:
        raise UnsupportedModelError(
            f"{source.name if source else 'the model'} has no MatMul or Gemm with a constant "
            "2-D float32 weight"
            + (
                f" ({len(skipped)} weighted op(s) left float, first: {skipped[0].reason})"
                if skipped
                else ""
            )
            + ": there is nothing for weight-only quantization; for INT8 of weights and "
            "activations drop --weights"
        )
    layers, notes = _shared_weights(layers)
    warnings: list[str] = []
    batches = _batches(loaded, calibration, cfg, batch_size, layers)
    layers = [_resolve_algorithm(x, batches is not None) for x in layers]
    held = batches[:FIDELITY_BATCHES] if batches and cfg.fidelity_batches else []
    reference = run_outputs(loaded, held, profile.fused_validation, "float") if held else None
    progress = _progress(cfg)
    results = quantize_layers(loaded, layers, batches, progress)
    before = sum(x.k * x.n * 4 for x in {x.weight: x for x in layers}.values())
    level = (
        DEFAULT_ACCURACY_LEVEL if cfg.weight_accuracy_level is None else cfg.weight_accuracy_level
    )
    records = [_record(x, results[x.node]) for x in layers]
    written = [
        WeightOnlyLayer(x.node, x.weight, results[x.node].codes, results[x.node].input_scale)
        for x in layers
    ]
    del results  # the codes live on in ``written`` until they are packed into the model
    materialize_weight_only(loaded, written, profile, level if fmt.writer == "matmul_nbits" else 0)
    del written
    if ir.external.lazy_nbytes(loaded) < ir.external.LAZY_BYTES:
        ir.external.load_all(loaded)  # weights that stayed float (norms, a float table)
    notes += _format_notes(layers, profile, level)
    report = WeightOnlyReport(
        model=source.name if source else "<in-memory model>",
        backend=profile.name,
        config=cfg.to_dict(),
        calibration_batches=len(batches or []),
        layers=records,
        skipped=[(s.node, s.op_type, s.reason) for s in skipped],
        weight_bytes=(before, _stored_bytes(loaded, layers)),
        notes=notes,
        warnings=warnings,
    )
    _validate(loaded, profile, report, held, reference)
    return QuantizedModel(loaded, report, source)


def check_block_size(cfg: QuantConfig, profile: BackendProfile) -> None:
    """Refuse a block size the backend cannot run, before any work."""
    fmt = profile.weight_only
    assert fmt is not None
    sizes = [cfg.block_size] + [ov.block_size for ov in cfg.overrides]
    for size in sizes:
        if size is None or size == 0:
            continue
        if fmt.block_sizes and size not in fmt.block_sizes:
            raise ConfigError(
                f"block_size {size}: {profile.name} runs weight blocks of "
                f"{' or '.join(str(b) for b in sorted(fmt.block_sizes))} only"
            )
        if not fmt.block_sizes and (size < fmt.min_block_size or size & (size - 1)):
            raise ConfigError(
                f"block_size {size}: {profile.name} runs blocks of a power of two >= "
                f"{fmt.min_block_size} (16, 32, 64, 128, ...); 0 gives one scale per output channel"
            )
    if (
        cfg.block_size == 0
        and cfg.weights == "int4"
        and 4 not in fmt.bits - fmt.blocked_bits
        and fmt.block_sizes
    ):
        raise ConfigError(
            f"block_size 0 (per channel): {profile.name} runs int4 weights block-wise only "
            f"({' or '.join(str(b) for b in sorted(fmt.block_sizes))})"
        )


def _min_opset(cfg: QuantConfig, profile: BackendProfile) -> int:
    fmt = profile.weight_only
    assert fmt is not None
    if fmt.writer == "dequantize_linear" and cfg.weights == "int4":
        return max(profile.min_opset, fmt.blocked_opset)
    return profile.min_opset


def _refuse_weight_only(model: onnx.ModelProto) -> None:
    found = sorted({n.op_type for n in model.graph.node if n.op_type in ir.WEIGHT_ONLY_OPS})
    if found:
        raise UnsupportedModelError(
            f"the model already holds weight-only quantized ops ({', '.join(found)}); onnxq "
            "quantizes float models: give it the float original"
        )


def _batches(
    model: onnx.ModelProto, calibration: Any, cfg: QuantConfig, batch_size: int, layers: list[Layer]
) -> list[Batch] | None:
    """The calibration batches kept for the run (None: no data)."""
    wants = {x.algorithm for x in layers} - {"auto", "rtn"}
    if calibration is None:
        if wants:
            raise CalibrationDataError(
                f"--algorithm {sorted(wants)[0]} measures the layers' inputs: give calibration "
                "data (--calib DATA), or use --algorithm rtn, which needs none"
            )
        return None
    source = open_source(calibration, model_inputs(ir.Graph(model)), batch_size, cfg.preprocess)
    limit = cfg.max_batches or DEFAULT_BATCHES
    out: list[Batch] = []
    for batch in source:
        out.append(batch)
        if len(out) >= limit:
            break
    if not out:
        raise CalibrationDataError("the calibration data holds no batch")
    return out


def _resolve_algorithm(layer: Layer, has_data: bool) -> Layer:
    if layer.algorithm == "auto":
        return replace(
            layer, algorithm=DEFAULT_ALGORITHM if has_data and layer.activation else "rtn"
        )
    return layer


def _shared_weights(layers: list[Layer]) -> tuple[list[Layer], list[str]]:
    """Layers that read one weight share its storage: they get one format (the widest their
    settings ask for) and round to nearest (there is no single input to calibrate it
    against).  Returns the layers and a note per shared weight."""
    readers: dict[str, list[Layer]] = {}
    for x in layers:
        readers.setdefault(x.weight, []).append(x)
    notes, shared = [], {}
    for weight, group in readers.items():
        if len(group) < 2:
            continue
        fmt = max((x.fmt for x in group), key=lambda f: (f.bits, -(f.block_size or 1 << 30)))
        for x in group:
            shared[x.node] = replace(x, fmt=fmt, algorithm="rtn")
        notes.append(
            f"weight {weight!r} is read by {len(group)} layers "
            f"({', '.join(x.node for x in group)}): stored once as {fmt.describe()}, rounded to "
            "nearest (no single input to calibrate it against)"
        )
    return [shared.get(x.node, x) for x in layers], notes


def _format_notes(layers: list[Layer], profile: BackendProfile, level: int) -> list[str]:
    notes = []
    short = [x.node for x in layers if x.fmt.block_size and x.k % x.fmt.block_size]
    if short:
        notes.append(
            f"{len(short)} layer(s) have an input size that the block size does not divide "
            f"(first: {short[0]}): their last block is shorter (padded with zeros in the file)"
        )
    if profile.weight_only is not None and profile.weight_only.writer == "matmul_nbits":
        notes.append(
            f"MatMulNBits accuracy_level {level}"
            + (": onnxruntime computes with int8-quantized activations" if level == 4 else "")
        )
    return notes


def _record(layer: Layer, result: Quantized) -> LayerRecord:
    return LayerRecord(
        layer.node,
        layer.op_type,
        layer.weight,
        result.codes.fmt.describe(),
        result.algorithm + (" (input scales)" if result.input_scale is not None else ""),
        result.note or layer.why,
        result.error,
    )


def _stored_bytes(model: onnx.ModelProto, layers: list[Layer]) -> int:
    names = {x.weight for x in layers}
    return sum(
        len(t.raw_data)
        for t in model.graph.initializer
        if any(t.name.startswith(f"{n}_") for n in names)
    )


def _progress(cfg: QuantConfig) -> Any:
    if not cfg.progress or not sys.stderr.isatty():
        return None
    return lambda text: print(f"\r\033[K{text[:100]}", end="", file=sys.stderr, flush=True)


def _validate(
    model: onnx.ModelProto,
    profile: BackendProfile,
    report: WeightOnlyReport,
    held: list[Batch],
    reference: list[dict[str, Any]] | None,
) -> None:
    violations = check(model, profile)
    report.violations = violations
    if violations:
        raise BackendConstraintError(
            f"the quantized model breaks {len(violations)} {profile.name} constraint(s), first: "
            f"{violations[0]}; this is a bug in onnxq, please report it",
            violations,
        )
    if reference is None:
        report.notes.append("fidelity not measured: no calibration data")
        return
    report.fidelity_mode = (
        "onnxruntime with its optimizations (the weight-only kernels users run)"
        if profile.fused_validation
        else "onnxruntime, optimizations off: the DequantizeLinear graph's own arithmetic"
    )
    quant = _outputs_from_file(model, held, profile.fused_validation)
    report.fidelity = fidelity(reference, quant, class_axes(model))


def _outputs_from_file(
    model: onnx.ModelProto, held: list[Batch], fused: bool
) -> list[dict[str, Any]]:
    """The quantized model's outputs on ``held``, from a session that reads the model from a
    temporary file with external data: a serialized copy of a large model (and onnxruntime's
    copy of that) would otherwise sit next to the model during the check."""
    import tempfile
    from pathlib import Path

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if fused
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    with tempfile.TemporaryDirectory(prefix="onnxq-") as tmp:
        path = Path(tmp) / "quantized.onnx"
        ir.save_model(model, path, external_data=True)
        try:
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise UnsupportedModelError(
                f"onnxruntime cannot load the quantized model: {' '.join(str(exc).split())[:400]}"
            ) from None
        return run_outputs(session, held, fused, "quantized")


__all__ = ["check_block_size", "quantize_weight_only"]
