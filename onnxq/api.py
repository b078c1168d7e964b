"""The pipeline as one readable function: the first half (profile, prepare, float rewrites,
facts), place (with calibration), the ``--target`` search, recovery after calibration,
materialize, verify, report.

Each stage is a function of its own module and returns data; :func:`quantize` wires them and
:func:`onnxq.report.messages.messages` turns their results into the report's warnings and notes.

Where things plug in: a float rewrite of the model (cross-layer equalization, SmoothQuant) in
:func:`onnxq.recover.stages.rewrite_float`, which the first half
(:func:`onnxq.mixed.front.float_graph`, shared with ``explain`` and ``analyze
--sensitivity``) runs before ``GraphFacts.of``; a step that needs the statistics (ranges,
integer weights, bias corrections) in :func:`onnxq.recover.pipeline.after_calibration`, before
``materialize``.  A pass returns its result as data, which goes into
:class:`onnxq.report.messages.Outcome` and the report.

The options become the run's recipe first (:mod:`onnxq.config.recipes`: static, dynamic or
weight-only), which refuses an option its kind would ignore.  A weight-only run
(``weight_only``: int4/int8 MatMul weights, float activations) has no
activations to place or calibrate: :func:`onnxq.weightonly.pipeline.quantize_weight_only`
runs it, with the same ``prepare``, ``float_reference`` and ``verify`` stages around its own
layer search, layer-by-layer weight pass and writer.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.target import target_record
from onnxq.calibrate.cache import calibration_cache
from onnxq.calibrate.engine import CalibrationResult
from onnxq.calibrate.measure import RuntimeQuantization, statistics_source
from onnxq.config.recipes import ActivationRecipe, WeightOnlyRecipe, refuse_call_options
from onnxq.config.resolve import ConfigLike, run_config
from onnxq.errors import CalibrationDataError, OutputError
from onnxq.materialize.metadata import Placed
from onnxq.materialize.precision_record import PrecisionSplit
from onnxq.materialize.qdq import materialize
from onnxq.materialize.typing import write_precisions
from onnxq.mixed.front import FloatGraph, float_graph
from onnxq.mixed.record import MixedPrecision, SearchRecord
from onnxq.mixed.search import accuracy_target, target_search
from onnxq.numerics.accuracy_target import AccuracyTarget
from onnxq.place.annotations import Annotations
from onnxq.place.loop import place
from onnxq.place.precision import LOW_TYPES, float_activations, plan_precisions
from onnxq.prepare.stage import ModelLike
from onnxq.recover.pipeline import Recovered, after_calibration
from onnxq.recover.record import BiasCorrectionRecord, RecoveryRecord
from onnxq.report.compose import Report
from onnxq.report.messages import GraphView, Outcome, blame_conversion, messages
from onnxq.runtime.device import SessionSettings, using
from onnxq.scale.executor import Executor
from onnxq.validate.verify import Verification, float_reference, verify


@dataclass
class QuantizedModel:
    """The result of :func:`quantize`: the Q/DQ model and its report.

    For an input whose external data was left on disk (``onnxq.ir.external.LAZY_BYTES``),
    float weights that stayed float are read into ``model`` unless they too pass that size;
    then they still point into the input's data file, and :meth:`save` copies them out.
    """

    model: onnx.ModelProto
    report: Report
    source: Path | None = None

    def save(
        self,
        path: str | os.PathLike[str],
        report: str | os.PathLike[str] | None = None,
        external_data: bool | None = None,
    ) -> list[Path]:
        """Write the model (atomically; never over the input file) and optionally the report."""
        out = Path(path)
        check_paths(
            {"output": out, "report": report},
            {"input model": self.source} if self.source is not None else {},
        )
        if report is not None and not Path(report).parent.is_dir():
            raise OutputError(f"report folder does not exist: {Path(report).parent}")
        written = ir.save_model(self.model, out, external_data=external_data)
        if report is not None:
            try:
                self.report.write(report)
            except BaseException:
                for path in written:  # all or nothing
                    path.unlink(missing_ok=True)
                raise
            written.append(Path(report))
        return written


def check_paths(
    outputs: dict[str, str | os.PathLike[str] | None],
    inputs: dict[str, str | os.PathLike[str] | None],
) -> None:
    """Raise :class:`OutputError` when two of ``outputs`` name the same file, or one of them
    names one of ``inputs`` (name -> path; None: not given): one file would overwrite another,
    and an input is never overwritten."""
    seen: dict[Path, str] = {}
    for what, path in inputs.items():
        if path is not None:
            seen.setdefault(Path(path).resolve(), what)
    for what, path in outputs.items():
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            other = seen[key]
            kind = "the " + other if other in inputs else "also the " + other
            raise OutputError(
                f"{what} {path} is {kind}; choose another path"
                + (" (an input is never overwritten)" if other in inputs else "")
            )
        seen[key] = what


def quantize(
    model: ModelLike,
    calibration: Any = None,
    config: ConfigLike = None,
    *,
    target: AccuracyTarget | str | None = None,
    executor: Executor | None = None,
    **options: Any,
) -> QuantizedModel:
    """Quantize ``model`` to a Q/DQ model (INT8, or the config's ``precision``), with
    ``dynamic=True`` to onnxruntime's dynamically quantized kernels, or with
    ``weight_only="int4"|"int8"`` its MatMul/Gemm weights alone (docs/weight-only.md).

    Args:
        model: an ONNX file path or an ``onnx.ModelProto`` (never modified).
        calibration: a folder of ``.npz``/``.npy`` batches, one ``.npz`` with a leading sample
            axis (``batch_size`` samples per batch), or any iterable of
            ``{input_name: np.ndarray}`` (optional with ``dynamic`` or ``load_calibration``:
            then it only feeds the fidelity check).
        config: a :class:`QuantConfig`, a recipe (``onnxq.config.recipes``), a dict of its
            fields (flat or by section) or a YAML file; ``options`` override it.
        target: an accuracy target to meet by keeping the fewest, most harmful layers float
            (``onnxq.mixed.search``): ``"cosine=0.999"`` (as the config's
            ``target_accuracy``), or an :class:`~onnxq.numerics.accuracy_target.AccuracyTarget`,
            whose metric may be a callable ``metric(reference, quantized) -> float`` and whose
            ``heldout`` the data to measure it on (default: the first ``heldout_batches``
            calibration batches, which calibration then skips).  The report's
            ``mixed_precision`` says what was kept and whether the target was met; a missed
            target is a warning, and the best model found is returned.
        executor: where the calibration batches are observed, in shards whose statistics
            merge exactly, and where the accuracy target's trials run
            (``onnxq.scale.RayExecutor("auto")``: a Ray cluster); the output is the same.
        options: config fields by name (docs/config.md), e.g. ``backend="onnxruntime"``,
            ``method="entropy"``, ``exclude=["head*"]``, ``batch_size=8``,
            ``save_calibration="stats.json"``, ``adaround=True``.

    Returns:
        A :class:`QuantizedModel` with ``.model``, ``.report`` and ``.save(path)``.
    """
    recipe = run_config(config, options).recipe()  # an option its kind ignores: refused
    refuse_call_options(recipe, target=target, executor=executor)
    if isinstance(recipe, WeightOnlyRecipe):  # activations stay float: nothing to place
        from onnxq.weightonly.pipeline import quantize_weight_only

        run = quantize_weight_only(model, calibration, recipe)
        return QuantizedModel(run.model, run.report, run.source)
    _check_sources(model, calibration, recipe)
    compare = recipe.placement.score_map_ranges == "compare" and _can_compare(
        recipe, calibration, target
    )
    first, by_scores = _quantize_static(recipe, executor, model, calibration, target)
    if not (compare and by_scores):
        return first
    per_tensor = dataclasses.replace(recipe.placement, score_map_ranges="auto")
    second, _ = _quantize_static(
        recipe.replace(placement=per_tensor), executor, model, calibration, target
    )
    return _better_score_map_run(first, second)


def _can_compare(
    cfg: ActivationRecipe, calibration: Any, target: AccuracyTarget | str | None
) -> bool:
    """Whether ``score_map_ranges: compare`` may quantize a score-map model twice: not with
    an accuracy target (its search would run twice) nor a calibration cache (one run's
    statistics) nor ``dynamic`` (no ranges), and only from data that can be read twice (a
    path, or an iterable that is not its own iterator)."""
    goal = accuracy_target(cfg.accuracy.target_accuracy, target)
    rereadable = isinstance(calibration, (str, os.PathLike)) or (
        calibration is not None and iter(calibration) is not calibration
    )
    cached = cfg.calibration.save_calibration is not None or cfg.calibration.load_calibration
    return goal is None and not cached and not cfg.profile.dynamic and rereadable


def _worst_cosine(run: QuantizedModel) -> float | None:
    """The lowest cosine of a run's outputs against float on the fidelity batches."""
    cosines = [f.cosine for f in run.report.fidelity if f.compared == "cosine"]
    return min(cosines) if cosines else None


def _better_score_map_run(minmax: QuantizedModel, per_tensor: QuantizedModel) -> QuantizedModel:
    """Of a score-map model quantized with ``minmax`` for every activation and with the
    per-tensor choice, the one whose worst output agrees better with float (``minmax`` on a
    tie or where neither was measured), its report saying so."""
    a, b = _worst_cosine(minmax), _worst_cosine(per_tensor)
    keep = per_tensor if a is not None and b is not None and b > a else minmax
    shown = {"minmax": a, "auto": b}
    said = ", ".join(
        f"{k} {v:.4f}" if v is not None else f"{k} unmeasured" for k, v in shown.items()
    )
    keep.report.notes.append(
        "score_map_ranges: compare quantized this score-map model twice, every activation "
        f"with minmax and with auto's per-tensor choice (worst output cosine: {said}); it "
        f"kept {'the per-tensor choice' if keep is per_tensor else 'minmax'}. "
        "score_map_ranges: minmax or auto in a config file skips the second run"
    )
    keep.report.config["score_map_ranges"] = "compare"  # the run's setting, not the trial's
    return keep


def _quantize_static(
    cfg: ActivationRecipe,
    executor: Executor | None,
    model: ModelLike,
    calibration: Any,
    target: AccuracyTarget | str | None,
) -> tuple[QuantizedModel, bool]:
    """One static (or dynamic) run of :func:`quantize`; also whether ``auto`` calibrated the
    activations with the head method because the outputs are score maps."""
    goal = accuracy_target(cfg.accuracy.target_accuracy, target)
    save_calibration = cfg.calibration.save_calibration
    load_calibration = cfg.calibration.load_calibration
    cached = save_calibration is not None or load_calibration is not None
    front = float_graph(
        model, cfg, calibration, hold=goal is not None,
        heldout=goal.heldout if goal is not None else None, cached=cached,
        guard=blame_conversion,
    )  # fmt: skip
    prepared, profile, steps = front.prepared, front.profile, front.steps
    with blame_conversion(prepared.load.opset_upgrade), using(SessionSettings(cfg.run.device)):
        measure = statistics_source(
            prepared.model, front.facts, profile, front.data, front.inputs, cfg.calibration,
            save_calibration is not None, load_calibration, executor,
        )  # fmt: skip
        if profile.high_precision in LOW_TYPES and not isinstance(measure, RuntimeQuantization):
            measure.observe_also(float_activations(prepared.model))  # the plan reads them
        placement = place(front.facts, profile, cfg.placement, measure)
        mixed, learned = None, None  # learned: AdaRound's weights, learned for the trials
        if goal is not None:
            mixed, learned = target_search(goal, front, cfg, measure, placement, executor)
            placement = mixed.placement
        annotations = placement.annotations
        cache = None  # written last: a run that fails or is interrupted leaves no file
        if save_calibration is not None and load_calibration is None:
            cache = _cache(placement.statistics, front.graph, profile.name)
        recovered = after_calibration(
            steps, prepared.model, annotations, placement.statistics, learned
        )
        qparams, held = recovered.ranges.qparams, recovered.statistics.held
        # the float outputs first: their session is gone before the quantized model is built
        reference = float_reference(prepared.take_reference(), prepared.model, held, profile)
        float_weight_bytes = ir.weight_nbytes(prepared.model)
        placed = materialize(
            prepared.model, annotations, qparams, profile, cfg.weights, recovered.chosen
        )
        precision = typed(
            prepared.model, profile.high_precision, placement.statistics, cfg,
            prepared.load.half_io,
        )  # fmt: skip
        if mixed is not None:  # the target's verdict on the model written, recovery included
            mixed = mixed.as_written(prepared.model)
        if ir.external.lazy_nbytes(prepared.model) < ir.external.LAZY_BYTES:
            ir.external.load_all(prepared.model)  # float weights that stayed float (biases)
        verification = verify(
            prepared.model, reference, held, profile, cfg.validate.agreement_threshold
        )
    outcome = _outcome(cfg, front, annotations, recovered, placed, verification, mixed)
    report = _report(dataclasses.replace(outcome, precision=precision))
    report.weight_bytes = (float_weight_bytes, ir.weight_nbytes(prepared.model))
    if save_calibration is not None and cache is not None:
        ir.atomic_write_bytes(save_calibration, cache)
    quantized = QuantizedModel(prepared.model, report, prepared.source)
    return quantized, annotations.score_map_method is not None


def typed(
    model: onnx.ModelProto,
    high: str,
    statistics: CalibrationResult,
    cfg: ActivationRecipe,
    io_types: dict[str, int],
) -> PrecisionSplit:
    """Plan the precision of what stays float (``onnxq.place.precision``) from the peaks the
    calibration measured, write it into ``model`` (``onnxq.materialize.typing``), and say
    the split for the report; ``io_types``: an FP16/BF16 model's input and output types,
    which the output gets back."""
    peaks = {n: max(abs(s.min), abs(s.max)) for n, s in statistics.stats.items() if s.count}
    plan = plan_precisions(model, peaks, high, statistics.unobservable)
    record = write_precisions(model, plan, cfg.placement.keep_io_types, io_types)
    return PrecisionSplit.of(model, plan, record)


def _outcome(
    cfg: ActivationRecipe,
    front: FloatGraph,
    annotations: Annotations,
    recovered: Recovered,
    placed: list[Placed],
    verification: Verification,
    mixed: MixedPrecision | None,
) -> Outcome:
    """What the stages of a static or dynamic run returned, for its report."""
    return Outcome(
        config=cfg,
        profile=front.profile,
        profile_note=front.profile_note,
        prepared=front.prepared,
        graph=GraphView.of(front.graph, front.profile),
        inputs=front.inputs,
        annotations=annotations,
        statistics=recovered.statistics,
        remarks=recovered.ranges.remarks,
        bias=recovered.bias,
        placed=placed,
        verification=verification,
        mixed_precision=mixed,
        recovery=front.steps.recovery,
    )


def _cache(statistics: CalibrationResult, graph: ir.Graph, backend: str) -> bytes:
    """The calibration cache of ``statistics`` (``save_calibration``), as bytes to write."""
    return calibration_cache(
        statistics.stats, graph, backend, statistics.body_runs, statistics.unobservable
    )


def _report(outcome: Outcome) -> Report:
    """The report of a run: its decisions, its Q/DQ, its fidelity, and its messages."""
    o = outcome
    said = messages(o)
    return Report(
        model=o.prepared.source.name if o.prepared.source else "<in-memory model>",
        backend=o.profile.name,
        target_cpu=target_record(o.profile),
        config=o.config.to_dict(),
        simplify_passes=o.prepared.passes,
        decisions=o.annotations.decisions,
        placed=o.placed,
        calibration_batches=o.statistics.batches_seen,
        fidelity=o.verification.fidelity,
        fidelity_mode=o.verification.mode,
        warnings=said.warnings,
        notes=said.notes,
        sections=[
            BiasCorrectionRecord.of(o.bias),
            *([SearchRecord.of(o.mixed_precision)] if o.mixed_precision is not None else []),
            RecoveryRecord.of(o.recovery),
            *([o.precision] if o.precision is not None else []),
        ],
        default_session=o.verification.default_session,
    )


def _check_sources(model: ModelLike, calibration: Any, cfg: ActivationRecipe) -> None:
    """Refuse a run without data or statistics (``--dynamic`` needs neither), and a cache
    that would overwrite an input."""
    save, load = cfg.calibration.save_calibration, cfg.calibration.load_calibration
    check_paths(
        {"calibration cache to save": save},
        {
            "input model": model if isinstance(model, (str, os.PathLike)) else None,
            "calibration cache to load": load,
        },
    )
    if cfg.profile.dynamic:
        return
    if calibration is None and load is None:
        raise CalibrationDataError(
            "no calibration data given; pass --calib DATA (a folder of "
            ".npz batches, a .npz of samples, or .npy files) or "
            "--load-calibration FILE"
        )
