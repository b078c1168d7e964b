"""Weight-only quantization as one readable function: prepare, find the layers, choose their
integer weights (RTN, GPTQ, AWQ), materialize them, verify, report.

It shares the INT8 pipeline's first and last stages: :func:`onnxq.prepare.stage.prepare` (load,
refusals, simplify, the float reference), :func:`onnxq.validate.verify.float_reference` and
:func:`onnxq.validate.verify.verify` (the backend's constraints, onnxruntime must run the output,
its fidelity against the float model).  Its middle is its own: activations stay float, so there is
nothing for the placement loop to place or calibrate; the layers are found by
:func:`onnxq.weightonly.targets.find_layers` and their weights measured layer group by layer
group on the inputs the already-quantized model computes (:mod:`onnxq.weightonly.engine`),
and written by :mod:`onnxq.materialize.blocked`.  Calibration data is optional: without it
every layer is rounded to nearest.  It runs a :class:`~onnxq.config.recipes.WeightOnlyRecipe`
and reads each option from its section; the options it does not read (static INT8's target,
recovery, calibration and placement options) are refused when the recipe is made
(:mod:`onnxq.config.recipes`, by :meth:`onnxq.config.QuantConfig.recipe` in
:func:`onnxq.quantize`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.profile import PROFILES, BackendProfile
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.placement import PlacementOptions
from onnxq.config.recipes import WeightOnlyRecipe
from onnxq.config.weightonly import WeightOnlyOptions
from onnxq.data.inputs import Batch, model_inputs
from onnxq.data.sources import check_batch, open_source
from onnxq.errors import CalibrationDataError, ConfigError, UnsupportedModelError
from onnxq.materialize.blocked import WeightOnlyLayer, materialize_weight_only
from onnxq.prepare.stage import ModelLike, prepare
from onnxq.report.compose import Report
from onnxq.report.messages import GraphView, blame_conversion
from onnxq.validate.verify import float_reference, verify
from onnxq.weightonly.engine import quantize_layers
from onnxq.weightonly.layers import record, resolve_algorithm, share_weights
from onnxq.weightonly.outcome import SharedWeight, WeightOnlyOutcome
from onnxq.weightonly.report import weight_only_report
from onnxq.weightonly.targets import Layer, Skipped, find_layers

# measured defaults (docs/weight-only.md, scripts/bench_int4.py)
DEFAULT_BATCHES = 16  # calibration batches used when max_batches is not set
DEFAULT_ACCURACY_LEVEL = 4
FIDELITY_BATCHES = 1  # held batches at most (a float and a quantized pass; an LM's logits
# are large: smollm2's for one window of 512 tokens take 100 MB)


@dataclass
class WeightOnlyRun:
    """The quantized model, its report, and the file it came from (None: in memory)."""

    model: onnx.ModelProto
    report: Report
    source: Path | None


def quantize_weight_only(
    model: ModelLike,
    calibration: Any,
    recipe: WeightOnlyRecipe,
) -> WeightOnlyRun:
    """Quantize the weights of ``model``'s MatMul/Gemm layers (``recipe.weightonly``); see
    :func:`onnxq.quantize`, which calls this when ``weight_only`` is set."""
    options, placement, calib = recipe.weightonly, recipe.placement, recipe.calibration
    profile = weight_only_profile(PROFILES[recipe.profile.backend], options, placement)
    prepared = prepare(model, profile, recipe.run.simplify, widen=False)  # keeps its types
    with blame_conversion(prepared.load.opset_upgrade):
        graph = ir.Graph(prepared.model)
        view = GraphView.of(graph, profile)
        layers, skipped, shared = _layers(graph, profile, options, placement, prepared.source)
        batches = _batches(graph, calibration, calib, layers)
        layers = [resolve_algorithm(x, batches is not None) for x in layers]
        held = (batches or [])[: min(calib.fidelity_batches, FIDELITY_BATCHES)]
        results = quantize_layers(prepared.model, layers, batches, _progress(calib.progress))
        # the float outputs first: their session is gone before the quantized model is built
        reference = float_reference(prepared.take_reference(), prepared.model, held, profile)
        level = _accuracy_level(profile, options)
        records = [record(x, results[x.node]) for x in layers]
        written = [
            WeightOnlyLayer(x.node, x.weight, results[x.node].codes, results[x.node].input_scale)
            for x in layers
        ]
        del results  # the codes live on in ``written`` until they are packed into the model
        stored = materialize_weight_only(prepared.model, written, profile, level or 0)
        del written
        if ir.external.lazy_nbytes(prepared.model) < ir.external.LAZY_BYTES:
            ir.external.load_all(prepared.model)  # weights that stayed float (norms)
        verification = verify(prepared.model, reference, held, profile)
    before = sum(x.k * x.n * 4 for x in {x.weight: x for x in layers}.values())
    outcome = WeightOnlyOutcome(
        config=recipe,
        profile=profile,
        prepared=prepared,
        graph=view,
        layers=layers,
        records=records,
        skipped=skipped,
        shared=shared,
        weight_bytes=(before, stored),
        accuracy_level=level,
        calibration_batches=len(batches or []),
        verification=verification,
    )
    return WeightOnlyRun(prepared.model, weight_only_report(outcome), prepared.source)


def weight_only_profile(
    profile: BackendProfile, options: WeightOnlyOptions, placement: PlacementOptions
) -> BackendProfile:
    """``profile`` for a weight-only run: the opset its blocked DequantizeLinear needs; a
    backend without weight-only layers, or a block size it cannot run (the weight-only
    section's or an override's in ``placement``), is refused before any work."""
    fmt = profile.weight_only
    if fmt is None:
        raise ConfigError(f"backend {profile.name} runs no weight-only layers")
    sizes = [options.block_size] + [ov.block_size for ov in placement.overrides]
    for size in sizes:
        if not size:
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
    if options.block_size == 0 and options.weight_only == "int4" and fmt.block_sizes:
        raise ConfigError(
            f"block_size 0 (per channel): {profile.name} runs int4 weights block-wise only "
            f"({' or '.join(str(b) for b in sorted(fmt.block_sizes))})"
        )
    if fmt.writer == "dequantize_linear" and options.weight_only == "int4":
        return replace(profile, min_opset=max(profile.min_opset, fmt.blocked_opset))
    return profile


def _layers(
    graph: ir.Graph,
    profile: BackendProfile,
    options: WeightOnlyOptions,
    placement: PlacementOptions,
    source: Path | None,
) -> tuple[list[Layer], list[Skipped], list[SharedWeight]]:
    """The layers to quantize (layers sharing a weight in one format), the weighted ops left
    float, and the shared weights; a model with no layer is refused."""
    layers, skipped = find_layers(graph, profile, options, placement)
    if not layers:
        first = (
            f" ({len(skipped)} weighted op(s) left float, first: {skipped[0].reason})"
            if skipped
            else ""
        )
        raise UnsupportedModelError(
            f"{source.name if source else 'the model'} has no MatMul or Gemm with a constant "
            f"2-D float32 weight{first}"
            + ": there is nothing for weight-only quantization; for INT8 of weights and "
            "activations drop --weights"
        )
    layers, shared = share_weights(layers)
    return layers, skipped, shared


def _batches(
    graph: ir.Graph,
    calibration: Any,
    options: CalibrationOptions,
    layers: list[Layer],
) -> list[Batch] | None:
    """The calibration batches the run uses (``options``: the calibration section's
    ``max_batches``, ``batch_size`` and ``preprocess``), checked against the model's inputs
    (None: no data; an algorithm that needs data is then refused)."""
    wants = {x.algorithm for x in layers} - {"auto", "rtn"}
    if calibration is None:
        if wants:
            raise CalibrationDataError(
                f"--algorithm {sorted(wants)[0]} measures the layers' inputs: give calibration "
                "data (--calib DATA), or use --algorithm rtn, which needs none"
            )
        return None
    inputs = model_inputs(graph)
    limit = options.max_batches or DEFAULT_BATCHES
    out: list[Batch] = []
    for index, raw in enumerate(
        open_source(calibration, inputs, options.batch_size, options.preprocess)
    ):
        out.append(check_batch(raw, inputs, index))
        if len(out) >= limit:
            break
    if not out:
        raise CalibrationDataError("the calibration data holds no batch")
    return out


def _accuracy_level(profile: BackendProfile, options: WeightOnlyOptions) -> int | None:
    """MatMulNBits' accuracy level (None: the backend writes no MatMulNBits)."""
    if profile.weight_only is None or profile.weight_only.writer != "matmul_nbits":
        return None
    level = options.weight_accuracy_level
    return DEFAULT_ACCURACY_LEVEL if level is None else level


def _progress(shown: bool) -> Callable[[str], None] | None:
    """A progress line on stderr (``shown``: the calibration section's ``progress``), or None
    when it is off or stderr is no terminal."""
    if not shown or not sys.stderr.isatty():
        return None
    return lambda text: print(f"\r\033[K{text[:100]}", end="", file=sys.stderr, flush=True)


__all__ = ["WeightOnlyRun", "quantize_weight_only", "weight_only_profile"]
