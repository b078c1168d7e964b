"""The accuracy-recovery steps, one function per place in the pipeline
(:mod:`onnxq.recover.pipeline` calls them: once before calibration, once after).

* :func:`rewrite_float` before placement: cross-layer equalization, depthwise activation
  equalization and SmoothQuant, float rewrites of the model;
* :func:`recalibrate` after the float calibration: quantized-prefix ranges;
* :func:`search_ranges` after them: activation ranges chosen by the model's output error;
* :func:`choose_weights` before materialize: AdaRound's integer weights;
* :func:`correct_sequentially` just before materialize: biases corrected layer by layer on
  the quantized prefix.

Each does nothing unless its option is on, and records what it did in a :class:`Recovery`
(the report's ``recovery`` section); a step that cannot run (no calibration data that can be
read again, a model too large to copy) adds a warning instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.calibrate.engine import CalibrationResult
from onnxq.calibrate.ranges import ActivationRanges, activation_ranges
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import WeightOptions
from onnxq.config.placement import PlacementOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from onnxq.recover.adaround import ChosenWeight
from onnxq.recover.cle import equalize
from onnxq.recover.dwequal import equalize_depthwise
from onnxq.recover.prefix import PASSES, prefix_calibrate
from onnxq.recover.rangeerror import FloatOutputs
from onnxq.recover.rangesearch import FACTORS
from onnxq.recover.rangesearch import search_ranges as output_range_search
from onnxq.recover.rounders import get_rounder
from onnxq.recover.sequential import sequential_correction
from onnxq.recover.smoothquant import smooth


@dataclass
class Recovery:
    """What the recovery steps did, for the report (JSON-ready), their warnings, and notes
    (a step that is on by default and did not run says why in a note, not a warning)."""

    sections: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.sections)


@dataclass(frozen=True)
class Steps:
    """What every recovery step reads (the backend, the options, the calibration data) and
    where it says what it did (``recovery``)."""

    profile: BackendProfile
    options: RecoveryOptions
    calibration: CalibrationOptions
    weights: WeightOptions
    data: Iterable[Batch] | None
    inputs: list[InputSpec]
    recovery: Recovery
    bias_correction: bool = False


def measured_ranges(
    steps: Steps, annotations: Annotations, measured: CalibrationResult
) -> ActivationRanges:
    """The activation ranges of ``annotations`` from the statistics ``measured``, as the run
    computes them (the backend's observers, the config's percentile)."""
    percentile = steps.calibration.percentile
    return activation_ranges(annotations, measured.stats, steps.profile, percentile)


def measured_qparams(
    steps: Steps, annotations: Annotations, measured: CalibrationResult
) -> dict[str, QParams]:
    """:func:`measured_ranges`' qparams."""
    return measured_ranges(steps, annotations, measured).qparams


def rewrite_float(
    steps: Steps, model: onnx.ModelProto, placement: PlacementOptions, cached: bool = False
) -> onnx.ModelProto:
    """CLE and SmoothQuant on ``model`` (edited in place, returned with shapes inferred).

    ``cached``: the run saves or loads a calibration cache, whose statistics are those of the
    model as given: both steps are skipped (a cache saved with them would not fit a model
    loaded without them, nor the reverse)."""
    options, recovery, data = steps.options, steps.recovery, steps.data
    if cached:
        why = "skipped: a calibration cache holds the statistics of the model without it"
        if options.cle:
            recovery.warnings.append(f"cle {why}")
        if options.dw_equalization:
            recovery.warnings.append(f"depthwise equalization {why}")
        if options.smoothquant > 0:
            recovery.notes.append(f"smoothquant {why}")
        return model
    if options.cle:
        graph = ir.Graph(model)
        modified, pairs = equalize(graph)
        if modified:
            graph.commit()
            model = ir.infer_shapes(graph.model)
        recovery.sections["cle"] = {
            "equalized": sum(p.equalized for p in pairs),
            "pairs": [p.to_dict() for p in pairs],
        }
    if options.dw_equalization:
        readable = _readable_again(data, "depthwise equalization", recovery)
        if readable is not None:
            model = _equalize_depthwise(steps, model, readable)
    alpha = options.smoothquant
    tensors = _matmul_inputs(model, steps.profile, placement) if alpha > 0 else []
    readable = (
        _readable_again(data, "smoothquant", recovery, said=recovery.notes) if tensors else None
    )
    if readable is not None:
        model, smoothed = smooth(
            model,
            tensors,
            readable,
            steps.inputs,
            alpha=float(alpha),
            max_batches=steps.calibration.max_batches,
            progress=steps.calibration.progress,
            min_spread=options.smoothquant_min_spread,
        )
        recovery.sections["smoothquant"] = {
            "alpha": float(alpha),
            "min_spread": options.smoothquant_min_spread,
            "candidates": len(tensors),
            "tensors": [s.to_dict() for s in smoothed],
        }
    return model


def _equalize_depthwise(
    steps: Steps, model: onnx.ModelProto, data: Iterable[Batch]
) -> onnx.ModelProto:
    """Depthwise activation equalization (``dw_equalization`` > 0) on ``model``."""
    bound = steps.options.dw_equalization
    model, scaled = equalize_depthwise(
        model, data, steps.inputs, bound,
        steps.calibration.max_batches, steps.calibration.progress,
    )  # fmt: skip
    steps.recovery.sections["dw_equalization"] = {
        "max_scale": bound,
        "pairs": [p.to_dict() for p in scaled],
    }
    return model


def recalibrate(
    steps: Steps,
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    result: CalibrationResult,
) -> CalibrationResult | None:
    """Statistics measured again with the prefix quantized (``calibration_mode: prefix``), or None
    (keep the float ones); ``qparams``: the ranges of ``result``, the prefix's first ones."""
    if steps.options.calibration_mode != "prefix":
        return None
    data = _readable_again(steps.data, "prefix calibration", steps.recovery, model)
    if data is None:
        return None
    again = prefix_calibrate(
        model, annotations, qparams, result, steps.profile, steps.calibration, steps.weights,
        data, steps.inputs, functools.partial(measured_qparams, steps, annotations),
    )  # fmt: skip
    steps.recovery.sections["calibration"] = {
        "mode": "prefix",
        "passes": PASSES,
        "tensors": len([a for a in annotations.of_kind("activation") if a.tensor in result.stats]),
    }
    return again


class Overlaid:
    """A placement loop's ``measure`` whose statistics of the tensors in ``stats`` are
    replaced (the quantized-prefix ones, for the ``--target`` search's trials)."""

    def __init__(
        self, measure: Callable[[Mapping[str, bool]], CalibrationResult], stats: CalibrationResult
    ) -> None:
        self._measure, self._stats = measure, stats.stats

    def __call__(self, wanted: Mapping[str, bool]) -> CalibrationResult:
        result = self._measure(wanted)
        return replace(result, stats={**result.stats, **self._stats})


def search_statistics(
    steps: Steps,
    model: onnx.ModelProto,
    measure: Callable[[Mapping[str, bool]], CalibrationResult],
    annotations: Annotations,
    first: CalibrationResult,
) -> Callable[[Mapping[str, bool]], CalibrationResult]:
    """The ``measure`` the ``--target`` search scores its trials with: with
    ``calibration_mode: prefix``, the all-INT8 placement's quantized-prefix statistics over
    ``measure``'s (``annotations`` and ``first``: that placement and its statistics; the
    search then starts from the ranges the run will write), else ``measure``."""
    if steps.options.calibration_mode != "prefix":
        return measure
    again = recalibrate(
        steps, model, annotations, measured_qparams(steps, annotations, first), first
    )
    if again is None:
        return measure
    steps.recovery.sections["search_on_prefix_ranges"] = True
    return Overlaid(measure, again)


def search_ranges(
    steps: Steps,
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    result: CalibrationResult,
) -> dict[str, QParams]:
    """``qparams`` with each activation range chosen by the model's output error
    (``range_search: true``; else ``qparams``).  It runs after the (prefix) calibration, whose
    ranges it starts from, and before AdaRound and the bias corrections, which then fit the
    weights and biases to the ranges the model will have."""
    if not steps.options.range_search:
        return qparams
    data = _readable_again(steps.data, "range search", steps.recovery, model)
    if data is None:
        return qparams
    reference = FloatOutputs(
        model, data, steps.inputs, steps.calibration, steps.options.range_search_batches
    )
    if not reference.judging:
        steps.recovery.warnings.append(
            "range search skipped: it needs at least two calibration batches (the even ones "
            "choose the ranges, the odd ones judge them)"
        )
        return qparams
    chosen, tensors = output_range_search(
        model, annotations, qparams, result.stats, steps.profile, steps.weights,
        steps.calibration, reference,
    )  # fmt: skip
    steps.recovery.sections["range_search"] = {
        "factors": list(FACTORS),
        "changed": sum(t.kept for t in tensors),
        "tensors": [t.to_dict() for t in tensors],
    }
    return chosen


def choose_weights(
    steps: Steps, model: onnx.ModelProto, annotations: Annotations, qparams: dict[str, QParams]
) -> dict[str, ChosenWeight]:
    """AdaRound's integer weights (``adaround: true``), by weight tensor; ``qparams``: the
    activation ranges (what ``adaround_mode: sequential`` quantizes the prefix with)."""
    options = steps.options
    if not options.adaround:
        return {}
    data = _readable_again(steps.data, "adaround", steps.recovery, model)
    if data is None:
        return {}
    common = (steps.profile, options, steps.calibration, steps.weights, data, steps.inputs)
    chosen, section = get_rounder(options.adaround_mode)(model, annotations, qparams, *common)
    steps.recovery.sections["adaround"] = section
    return chosen


def correct_sequentially(
    steps: Steps,
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    chosen: dict[str, ChosenWeight],
) -> None:
    """Biases of ``model`` corrected layer by layer (``sequential_correction: true``)."""
    calibration = steps.calibration
    if not steps.options.sequential_correction:
        return
    data = _readable_again(steps.data, "sequential correction", steps.recovery, model)
    if data is None:
        return
    layers = sequential_correction(
        model, annotations, qparams, steps.profile, steps.weights, data, steps.inputs,
        calibration.max_batches, chosen, calibration.progress,
        calibration.memory_budget_mb * 2**20,
    )  # fmt: skip
    steps.recovery.sections["sequential_correction"] = {
        "corrected": sum(layer.kept for layer in layers),
        "layers": [layer.to_dict() for layer in layers],
    }


def _matmul_inputs(
    model: onnx.ModelProto, profile: BackendProfile, placement: PlacementOptions
) -> list[str]:
    """The activations that placement quantizes (before the data's exclusions) as the data
    input of a MatMul or Gemm."""
    graph = ir.Graph(model)
    by_name = {n.name: n for n in graph.nodes}
    placed = annotate(GraphFacts.of(graph, profile), profile, placement)
    return [
        ann.tensor
        for ann in placed.of_kind("activation")
        if any(
            index == 0 and by_name[node].op_type in ("MatMul", "Gemm")
            for node, index in ann.consumers
            if node in by_name
        )
    ]


def _readable_again(
    data: Iterable[Batch] | None,
    step: str,
    recovery: Recovery,
    copied: onnx.ModelProto | None = None,
    said: list[str] | None = None,
) -> Iterable[Batch] | None:
    """``data`` when ``step`` can read it once more (and, when it needs a copy of the model
    ``copied``, hold one next to it); else None, and why goes to ``said`` (default: the
    warnings)."""
    said = recovery.warnings if said is None else said
    if data is None:
        said.append(f"{step} skipped: it needs calibration data (--calib)")
        return None
    if iter(data) is data:
        said.append(
            f"{step} skipped: the calibration source can be read only once; pass a folder or a list"
        )
        return None
    if copied is not None and ir.model_nbytes(copied) >= ir.PROTO_LIMIT:
        said.append(
            f"{step} skipped: the model is too large to hold a quantized copy next to the float one"
        )
        return None
    return data


def summary(sections: dict[str, Any]) -> str:
    """One line for the terminal from the report's ``recovery`` section."""
    parts = []
    if "cle" in sections:
        cle = sections["cle"]
        parts.append(f"CLE equalized {cle['equalized']} of {len(cle['pairs'])} Conv pairs")
    if "dw_equalization" in sections:
        parts.append(
            f"depthwise equalization of {len(sections['dw_equalization']['pairs'])} activations"
        )
    if "smoothquant" in sections:
        sq = sections["smoothquant"]
        parts.append(
            f"SmoothQuant (alpha {sq['alpha']}) on {len(sq['tensors'])} of {sq['candidates']} "
            "MatMul/Gemm inputs"
        )
    if "calibration" in sections:
        parts.append(f"prefix calibration ({sections['calibration']['passes']} passes)")
    if "range_search" in sections:
        rs = sections["range_search"]
        parts.append(f"range search changed {rs['changed']} of {len(rs['tensors'])} ranges")
    if "adaround" in sections and "blocks" in sections["adaround"]:
        blocks = sections["adaround"]["blocks"]
        kept = sum(b["kept"] == "learned" for b in blocks)
        parts.append(f"block reconstruction learned {kept} of {len(blocks)} blocks")
    elif "adaround" in sections:
        layers = sections["adaround"]["layers"]
        mode = " (sequential)" if sections["adaround"].get("mode") == "sequential" else ""
        parts.append(
            f"AdaRound{mode} learned {sections['adaround']['learned']} of {len(layers)} layers"
        )
    if "sequential_correction" in sections:
        seq = sections["sequential_correction"]
        parts.append(
            f"sequential correction moved the bias of {seq['corrected']} of "
            f"{len(seq['layers'])} layers"
        )
    return "; ".join(parts)
