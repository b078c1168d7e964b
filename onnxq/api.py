"""The pipeline as one readable function: load, simplify, annotate, calibrate, materialize,
validate, report."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from onnxq import ir
from onnxq.annotate import (
    Annotations,
    annotate,
    grouped_conv_inputs,
    position_norm_convs,
    range_exclusions,
)
from onnxq.backends.check import check
from onnxq.backends.profile import BackendProfile, profile_for
from onnxq.backends.validate import (
    DOMINATED,
    SHAPE_CHANGED,
    OutputFidelity,
    class_axes,
    fidelity,
    padding_masks,
    run_outputs,
    selected_outputs,
)
from onnxq.bias_correction import BiasCorrection, correct_biases
from onnxq.calibrate import CalibrationResult, calibrate, calibration_cache
from onnxq.calibrate import load_calibration as load_calibration_file
from onnxq.config import QuantConfig
from onnxq.data import model_inputs, open_source
from onnxq.errors import (
    BackendConstraintError,
    CalibrationDataError,
    ConfigError,
    OnnxqError,
    OutputError,
    UnsupportedModelError,
)
from onnxq.materialize import materialize
from onnxq.observers import HISTOGRAM_METHODS, MethodOptions, QParams, activation_qparams
from onnxq.recover.adaround import ChosenWeight
from onnxq.recover.stages import Recovery, choose_weights, recalibrate, rewrite_float
from onnxq.report import Report
from onnxq.rewrites.simplify import simplify

ModelLike = str | os.PathLike[str] | onnx.ModelProto


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


def resolve_config(
    config: QuantConfig | str | os.PathLike[str] | dict[str, Any] | None, **options: Any
) -> QuantConfig:
    """A config from a QuantConfig, a YAML path or a dict, with keyword options on top."""
    if config is None:
        base = QuantConfig()
    elif isinstance(config, QuantConfig):
        base = config
    elif isinstance(config, dict):
        base = QuantConfig.from_dict(config)
    elif isinstance(config, (str, os.PathLike)):
        base = QuantConfig.from_yaml(config)
    else:
        raise ConfigError(
            f"config must be a QuantConfig, a dict or a YAML path, got {type(config).__name__}"
        )
    given = {k: v for k, v in options.items() if v is not None}
    known = {f.name for f in dataclasses.fields(QuantConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown option {unknown[0]!r}; valid options: {', '.join(sorted(known))}"
        )
    return base.replace(**given) if given else base


def load(
    model: ModelLike,
    profile: BackendProfile,
    notes: list[str] | None = None,
) -> tuple[onnx.ModelProto, Path | None]:
    """Load from a path, or take a copy of an in-memory model (the caller's stays untouched);
    an opset upgrade is noted in ``notes``."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        ir.sort_nodes(copy, notes)
        ir.check_model(copy, where="model")
        copy = ir.upgrade_opset(copy, profile.min_opset, notes=notes)
        ir.name_nodes(copy.graph)
        ir.unshare_biases(copy.graph)
        return ir.infer_shapes(copy), None
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    return ir.load_model(model, profile.min_opset, notes=notes), Path(model)


def quantize(
    model: ModelLike,
    calibration: Any = None,
    *,
    backend: str | None = None,
    method: str | None = None,
    exclude: Iterable[str] | None = None,
    config: QuantConfig | str | os.PathLike[str] | dict[str, Any] | None = None,
    batch_size: int = 1,
    save_calibration: str | os.PathLike[str] | None = None,
    load_calibration: str | os.PathLike[str] | None = None,
    **options: Any,
) -> QuantizedModel:
    """Quantize ``model`` to an INT8 Q/DQ model.

    Args:
        model: an ONNX file path or an ``onnx.ModelProto`` (never modified).
        calibration: a folder of ``.npz``/``.npy`` batches, one ``.npz`` with a leading sample
            axis, or any iterable of ``{input_name: np.ndarray}``.
        backend: ``tensorrt`` (default) or ``onnxruntime``.
        method: activation range method (``onnxq.observers.METHODS``).
        exclude: glob patterns over node names that stay float.
        config: a :class:`QuantConfig`, a dict of its fields, or a YAML file; the keyword
            arguments above (and ``options``, any QuantConfig field) override it.
        batch_size: batch size when ``calibration`` is one ``.npz`` of samples.
        save_calibration: write the observed statistics to this JSON file (histograms for
            every tensor, so any method can be used when it is loaded).
        load_calibration: quantize from statistics saved earlier instead of data;
            ``calibration`` is then optional and, if given, used only to measure fidelity.

    Returns:
        A :class:`QuantizedModel` with ``.model``, ``.report`` and ``.save(path)``.
    """
    if isinstance(exclude, (str, os.PathLike)):
        exclude = [str(exclude)]  # one pattern, not its characters
    cfg = resolve_config(
        config,
        backend=backend,
        method=method,
        exclude=tuple(exclude) if exclude is not None else None,
        **options,
    )
    check_paths(
        {"calibration cache to save": save_calibration},
        {
            "input model": model if isinstance(model, (str, os.PathLike)) else None,
            "calibration cache to load": load_calibration,
        },
    )
    if calibration is None and load_calibration is None:
        raise CalibrationDataError(
            "no calibration data given; pass --calib DATA (a folder of "
            ".npz batches, a .npz of samples, or .npy files) or "
            "--load-calibration FILE"
        )
    profile, profile_note = profile_for(cfg.backend, cfg.reduce_range)
    load_notes: list[str] = []
    loaded, source = load(model, profile, load_notes)
    with _upgrade_hint(load_notes):
        refuse_quantized(loaded, source, profile)
        weight_inputs = ir.drop_initializer_inputs(loaded)
        ir_note = _fit_ir_version(loaded)
        reference_bytes = _float_reference(loaded)
        passes: list[str] = []
        if cfg.simplify:
            loaded, passes = simplify(loaded)
        graph = ir.Graph(loaded)
        inputs = model_inputs(graph)
        data = (
            open_source(calibration, inputs, batch_size, cfg.preprocess)
            if calibration is not None
            else None
        )
        recovery = Recovery()  # accuracy recovery (onnxq.recover): exact float rewrites first
        loaded = rewrite_float(loaded, profile, cfg, data, inputs, recovery)
        graph = ir.Graph(loaded)
        cache: bytes | None = None
        if load_calibration is not None:
            annotations, result = _place_from_cache(
                loaded, graph, profile, cfg, data, inputs, load_calibration
            )
        else:
            assert data is not None
            annotations, result = _place_and_calibrate(
                loaded,
                graph,
                profile,
                cfg,
                data,
                inputs,
                all_histograms=save_calibration is not None,
            )
            # written last: a run that fails or is interrupted leaves no file behind
            cache = (
                calibration_cache(result.stats, graph, profile.name)
                if save_calibration is not None
                else None
            )
        qparams, warnings = _qparams(annotations, result, profile, cfg)
        again = recalibrate(
            loaded, annotations, qparams, result, profile, cfg, data, inputs, recovery,
            lambda measured: _qparams(annotations, measured, profile, cfg)[0],
        )  # fmt: skip
        if again is not None:  # quantized-prefix ranges
            result = again
            qparams, warnings = _qparams(annotations, result, profile, cfg)
        chosen = choose_weights(loaded, annotations, profile, cfg, data, inputs, recovery)
        warnings.extend(recovery.warnings)
        warnings.extend(_unmatched_patterns(graph, cfg))
        if profile_note:
            warnings.insert(0, profile_note)
        warnings.extend(_few_samples_warning(result, inputs))
        half = _half_precision_note(graph, profile)
        if half:
            warnings.append(half)
        if weight_inputs:
            shown = ", ".join(repr(n) for n in weight_inputs[:3])
            more = f" and {len(weight_inputs) - 3} more" if len(weight_inputs) > 3 else ""
            warnings.append(
                f"{len(weight_inputs)} initializers were also graph inputs ({shown}{more}; an old "
                "exporter's habit): they are plain weights in the output, no longer inputs"
            )
        corrections = _correct_biases(
            loaded, annotations, profile, cfg, data, inputs, warnings, chosen
        )
        # the float outputs first: its session is gone before the quantized model is built
        reference = _float_outputs(reference_bytes, result, profile)
        del reference_bytes
        placed = materialize(loaded, annotations, qparams, profile, cfg, chosen)
        if not placed:
            warnings.append(
                f"no op of this model is quantized for {profile.name} (the reasons are under 'left "
                "float'): the output computes exactly what the input model does"
            )
        if ir.external.lazy_nbytes(loaded) < ir.external.LAZY_BYTES:
            ir.external.load_all(loaded)  # float weights that stayed float (biases): now in memory
        report = Report(
            model=source.name if source else "<in-memory model>",
            backend=profile.name,
            config=cfg.to_dict(),
            simplify_passes=passes,
            decisions=annotations.decisions,
            placed=placed,
            calibration_batches=result.batches_seen,
            warnings=warnings,
            notes=[
                *load_notes,
                *([ir_note] if ir_note else []),
                *annotations.notes,
                *_budget_note(result, cfg),
            ],
            bias_corrections=corrections,
            recovery=recovery.to_dict(),
        )
        _validate(loaded, reference, result, profile, report)
        if save_calibration is not None and cache is not None:
            ir.atomic_write_bytes(save_calibration, cache)
        return QuantizedModel(loaded, report, source)


@contextlib.contextmanager
def _upgrade_hint(load_notes: list[str]) -> Iterator[None]:
    """Add to an onnxruntime failure that the model ran only after onnxq converted its opset
    (a note of :func:`onnxq.ir.upgrade_opset` in ``load_notes``): onnx's version converter may
    be what broke it."""
    try:
        yield
    except OnnxqError as exc:
        upgrades = [n for n in load_notes if n.startswith("the model's opset ")]
        if upgrades and exc.args and "onnxruntime" in str(exc.args[0]):
            converted = upgrades[0].split(" (")[0]  # "the model's opset N was converted to M"
            exc.args = (
                f"{exc.args[0]}; {converted} before onnxruntime ran it: if the original "
                "runs, the conversion is at fault; re-export the model with opset >= 13",
                *exc.args[1:],
            )
        raise


def _place_from_cache(
    model: onnx.ModelProto,
    graph: ir.Graph,
    profile: BackendProfile,
    cfg: QuantConfig,
    data: Iterable[Any] | None,
    inputs: list[Any],
    cache: str | os.PathLike[str],
) -> tuple[Annotations, CalibrationResult]:
    """Place Q/DQ from cached statistics; ``data`` (optional) only feeds the fidelity check."""
    float_tensors: dict[str, str] = {}
    float_nodes: dict[str, str] = {}
    held = []
    if data is not None and cfg.fidelity_batches:
        held = calibrate(
            model,
            {},
            data,
            inputs,
            max_batches=cfg.fidelity_batches,
            hold=cfg.fidelity_batches,
            progress=False,
        ).held
    grouped, positions = grouped_conv_inputs(graph), position_norm_convs(graph)
    for _ in range(4):
        annotations = annotate(graph, profile, cfg, float_tensors, float_nodes)
        stats = load_calibration_file(cache, graph, _observed(annotations), profile.name)
        more_t, more_n = range_exclusions(annotations, stats, cfg, grouped, positions)
        if more_t.keys() <= float_tensors.keys() and more_n.keys() <= float_nodes.keys():
            break
        float_tensors.update(more_t)
        float_nodes.update(more_n)
    samples = max((s.samples for s in stats.values()), default=0)
    # no batch was calibrated here: the statistics come from the cache
    return annotations, CalibrationResult(stats, 0, held, samples=samples)


def _place_and_calibrate(
    model: onnx.ModelProto,
    graph: ir.Graph,
    profile: BackendProfile,
    cfg: QuantConfig,
    data: Iterable[Any],
    inputs: list[Any],
    all_histograms: bool = False,
) -> tuple[Annotations, CalibrationResult]:
    """Annotate, calibrate, and annotate again while the data rules tensors or nodes out.

    Data-driven exclusions only remove Q/DQ, but a removal can make another rule choose a
    different tensor (a residual Add whose conv stayed float); such tensors are observed in an
    extra pass when the data can be read again, else they stay float with a reason.
    """
    float_tensors: dict[str, str] = {}
    float_nodes: dict[str, str] = {}
    result: CalibrationResult | None = None
    reiterable = iter(data) is not data
    grouped = grouped_conv_inputs(graph)
    positions = position_norm_convs(graph)
    for _ in range(4):
        annotations = annotate(graph, profile, cfg, float_tensors, float_nodes)
        wanted = _observed(annotations, all_histograms)
        missing = {t: h for t, h in wanted.items() if result is None or t not in result.stats}
        if result is None or (missing and reiterable):
            fresh = calibrate(
                model,
                missing,
                data,
                inputs,
                max_batches=cfg.max_batches,
                hold=cfg.fidelity_batches if result is None else 0,
                memory_budget=cfg.memory_budget_mb * 2**20,
                histogram_sample=cfg.histogram_sample,
                histogram_budget=cfg.histogram_budget,
                progress=cfg.progress,
                channels=frozenset(grouped.values()),
                positions=frozenset(positions.values()),
            )
            result = fresh if result is None else _merged(result, fresh)
        elif missing:
            for t in missing:
                float_tensors[t] = (
                    f"tensor {t!r} was not observed (the calibration source can be read only once)"
                )
            continue
        more_t, more_n = range_exclusions(annotations, result.stats, cfg, grouped, positions)
        if more_t.keys() <= float_tensors.keys() and more_n.keys() <= float_nodes.keys():
            return annotations, result
        float_tensors.update(more_t)
        float_nodes.update(more_n)
    assert result is not None
    return annotate(graph, profile, cfg, float_tensors, float_nodes), result


def _merged(first: CalibrationResult, extra: CalibrationResult) -> CalibrationResult:
    return CalibrationResult(
        {**first.stats, **extra.stats},
        first.batches_seen,
        first.held,
        first.sample_share,
        first.budget_sampled + extra.budget_sampled,
    )


def _fit_ir_version(model: onnx.ModelProto) -> str | None:
    """Stamp a model newer than onnxruntime reads with the IR version it reads, when the model
    uses nothing newer (onnx's own ``make_model`` writes its latest IR); returns a note."""
    from importlib.metadata import version

    newest, old = ir.runtime_ir_version(), model.ir_version
    if old <= newest or not ir.lower_ir_version(model, newest):
        return None  # a model that needs its IR version gets onnxruntime's own refusal
    return (
        f"the model's IR version {old} is newer than onnxruntime {version('onnxruntime')} "
        f"reads ({newest}); it uses nothing those versions added, so onnxq calibrated it "
        f"and wrote the output as IR {newest}"
    )


def _unmatched_patterns(graph: ir.Graph, cfg: QuantConfig) -> list[str]:
    """A warning for each exclude pattern or override that matches nothing in the model."""
    nodes = [(n.name, n.op_type) for n in graph.nodes]
    tensors = {t for n in graph.nodes for t in (*n.input, *n.output) if t}
    return [
        f"{what} matches no node or tensor of the model (after simplification; "
        "`onnxq explain MODEL` lists the node names): it changes nothing"
        for what in cfg.unmatched(nodes, tensors)
    ]


def _differs(out: OutputFidelity) -> bool:
    """Whether an output's comparison would give a warning of any kind."""
    if out.compared == "cosine":
        return out.cosine < LOW_FIDELITY or (
            out.worst_slice_cosine is not None and out.worst_slice_cosine < LOW_FIDELITY
        )
    return out.compared != "agreement" or out.cosine < 1.0


def _few_samples_warning(result: CalibrationResult, inputs: list[Any]) -> list[str]:
    """A warning when the ranges come from fewer than :data:`MIN_SAMPLES` samples."""
    samples = result.samples or max(
        (s.samples for s in result.stats.values() if s.count), default=0
    )
    if not samples or samples >= MIN_SAMPLES:
        return []
    # an image input: a float tensor of rank 4 (NCHW or NHWC)
    images = any(
        spec.dtype.kind == "f" and spec.shape is not None and len(spec.shape) == 4
        for spec in inputs
    )
    hint = " (several crops or scales of each image help)" if images else ""
    return [
        f"the ranges come from {samples} calibration sample(s): so few rarely cover the "
        f"inputs the model will meet; give at least {MIN_SAMPLES}, better 64-512, "
        f"representative samples{hint}"
    ]


def _budget_note(result: CalibrationResult, cfg: QuantConfig) -> list[str]:
    """A note when ``histogram_budget`` made some histograms sample more sparsely."""
    if not result.budget_sampled:
        return []
    return [
        f"{result.budget_sampled} histogram(s) counted at most {result.sample_share} values "
        f"per sample (of histogram_sample={cfg.histogram_sample}): histogram_budget="
        f"{cfg.histogram_budget} values per tensor over the whole calibration; min and "
        "max saw every value"
    ]


def _observed(annotations: Annotations, all_histograms: bool = False) -> dict[str, bool]:
    """Activation tensors to observe -> whether their method needs a histogram."""
    return {
        ann.tensor: all_histograms or ann.method in HISTOGRAM_METHODS
        for ann in annotations.of_kind("activation")
    }


def _qparams(
    annotations: Annotations, result: CalibrationResult, profile: BackendProfile, cfg: QuantConfig
) -> tuple[dict[str, QParams], list[str]]:
    opts = MethodOptions(percentile=cfg.percentile)
    out: dict[str, QParams] = {}
    warnings: list[str] = []
    for ann in annotations.of_kind("activation"):
        stats = result.stats[ann.tensor]
        if stats.count == 0:
            warnings.append(
                f"tensor {ann.tensor!r} produced no float values during calibration; it stays float"
            )
            continue
        symmetric = ann.settings.symmetric
        qp = activation_qparams(
            stats,
            ann.method,
            profile.activation_dtype,
            profile.activation_symmetric if symmetric is None else symmetric,
            opts,
            ann.settings.bits,
            ann.bounds,
        )
        if qp.note:
            warnings.append(f"tensor {ann.tensor!r}: {qp.note}")
        out[ann.tensor] = qp
    return out, warnings


def _correct_biases(
    model: onnx.ModelProto,
    annotations: Annotations,
    profile: BackendProfile,
    cfg: QuantConfig,
    data: Iterable[Any] | None,
    inputs: list[Any],
    warnings: list[str],
    chosen: dict[str, ChosenWeight] | None = None,
) -> list[BiasCorrection]:
    """Empirical bias correction (``onnxq.bias_correction``) when the config asks for it and
    the calibration data can be read again."""
    if not cfg.bias_correction or data is None:
        return []
    if iter(data) is data:
        warnings.append("bias correction skipped: the calibration source can be read only once")
        return []
    if ir.model_nbytes(model) >= ir.PROTO_LIMIT:
        warnings.append(
            "bias correction skipped: the model is too large to hold its "
            "quantized weights next to the float ones"
        )
        return []
    return correct_biases(model, annotations, profile, cfg, data, inputs, chosen)


def _half_precision_note(graph: ir.Graph, profile: BackendProfile) -> str | None:
    """Why a float16/bfloat16 model comes out with nothing quantized, and what to do."""
    half = [
        n.name
        for n in graph.nodes
        if n.op_type in profile.weight_axes
        and n.input
        and graph.elem_type(n.input[0]) in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    ]
    if not half:
        return None
    return (
        f"{len(half)} {'/'.join(sorted(profile.weight_axes))} op(s) compute in float16 or "
        f"bfloat16 (first: {half[0]!r}); onnxq quantizes float32 tensors, so they stay "
        "float: quantize the float32 original instead (TensorRT still builds it with FP16 "
        "and INT8 enabled)"
    )


def refuse_quantized(model: onnx.ModelProto, source: Path | None, profile: BackendProfile) -> None:
    """Raise :class:`UnsupportedModelError` if ``model`` already holds Q/DQ or integer ops: it
    is not onnxq's input, its quantization would clash with the backend's (uint8 zero points
    under TensorRT, double rounding)."""
    qdq = sorted({n.op_type for n in model.graph.node if n.op_type in ir.QDQ_OPS})
    integer = sorted({n.op_type for n in model.graph.node if ir.is_integer_op(n.op_type)})
    if not (qdq or integer):
        return
    where = source.name if source else "the model"
    if integer:
        trt = "TensorRT reads only Q/DQ models and " if set(integer) & profile.forbidden_ops else ""
        raise UnsupportedModelError(
            f"{where} is already quantized in onnxruntime's operator format (it holds "
            f"{', '.join(integer + qdq)}); {trt}onnxq quantizes float models: give it the "
            "float original"
        )
    raise UnsupportedModelError(
        f"{where} is already quantized (it holds {', '.join(qdq)}); onnxq quantizes float "
        "models: give it the float original, or run `onnxq check MODEL --backend B` to "
        "check this one"
    )


def _float_reference(model: onnx.ModelProto) -> bytes | None:
    """The loaded float model, kept for the fidelity check: its serialization, in which weights
    left on disk stay references (a few KB); None when the proto itself holds too much."""
    if ir.inline_nbytes(model) >= ir.PROTO_LIMIT:
        return None
    return ir.serialize(model, load_lazy=False)


def _float_outputs(
    reference_bytes: bytes | None, result: CalibrationResult, profile: BackendProfile
) -> list[dict[str, Any]] | None:
    """The float model's outputs on the held batches (None: no float copy was kept).

    The float reference runs like the quantized model (fusion on or off), so an onnxruntime
    optimizer quirk on the float graph cannot pass for quantization error.
    """
    if reference_bytes is None or not result.held:
        return None
    reference = onnx.load_from_string(reference_bytes)
    return run_outputs(reference, result.held, profile.fused_validation, "float")


MIN_SAMPLES = 32  # calibration samples below which the report warns that ranges may not cover
LOW_FIDELITY = 0.95  # output cosine (or top-1 agreement) below which the report warns
_LOW_FIDELITY_HINT = (
    "check it on your metric; `onnxq analyze` ranks the tensors that lose "
    "most, and --exclude keeps their ops float"
)


def _validate(
    model: onnx.ModelProto,
    reference: list[dict[str, Any]] | None,
    result: CalibrationResult,
    profile: BackendProfile,
    report: Report,
) -> None:
    violations = check(model, profile)
    report.violations = violations
    if violations:
        raise BackendConstraintError(
            f"the quantized model breaks {len(violations)} {profile.name} constraint(s), first: "
            f"{violations[0]}; this is a bug in onnxq's placement, please report it",
            violations,
        )
    report.fidelity_mode = (
        "onnxruntime, Q/DQ fused into int8 kernels"
        if profile.fused_validation
        else "onnxruntime, fusion off: the Q/DQ graph's own arithmetic"
    )
    if not result.held:
        report.notes.append(
            "fidelity not measured: no batches were held for it (statistics "
            "from a calibration cache without --calib data, or "
            "fidelity_batches: 0)"
        )
        return
    quant = run_outputs(model, result.held, profile.fused_validation, "quantized")
    if reference is None:
        report.warnings.append("model too large to keep a float copy: fidelity not measured")
        return
    selected = selected_outputs(model)
    report.fidelity = [
        dataclasses.replace(f, selected_by=selected.get(f.name))
        for f in fidelity(reference, quant, class_axes(model), padding_masks(result.held))
    ]
    for out in report.fidelity:
        if out.selected_by:
            if _differs(out):
                report.warnings.append(
                    f"output {out.name!r} holds the rows {out.selected_by} keeps, in score "
                    f"order, and differs from the float model's position by position "
                    f"({out.difference()}): the quantized model can keep other detections or "
                    "order them differently, so this comparison says little; match the "
                    "detections (e.g. by IoU) on your metric, and `onnxq analyze` compares "
                    "the scores and boxes before the selection"
                )
            continue
        if out.nonfinite_mismatch:
            report.warnings.append(
                f"output {out.name!r}: {out.nonfinite_mismatch} value(s) are NaN/Inf in one model "
                "but not in the other (or a different NaN/Inf) on the held batches: int8 "
                "rounding can move a value near 0 across the domain edge of a Sqrt, Log or "
                "division, or make a sum overflow; check the ops before this output "
                "(`onnxq analyze`)"
            )
        if out.nonfinite:
            report.notes.append(
                f"output {out.name!r}: {out.nonfinite} value(s) of the float model are NaN/Inf "
                "on the held batches (e.g. Sqrt or Log of a negative input); its cosine and "
                "error cover the values finite in both models"
            )
        if out.compared.startswith(SHAPE_CHANGED):
            report.warnings.append(
                f"output {out.name!r}: {out.compared.removeprefix('not compared: ')} on the held "
                "batches: the quantized model computes a different shape (a length rounded "
                "from activations, as a TTS duration predictor does, or a random draw); keep "
                "the ops that decide it float (--exclude), and check the output on your metric"
            )
        elif out.compared == "cosine" and out.cosine < LOW_FIDELITY:
            report.warnings.append(
                f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
                f"only (< {LOW_FIDELITY}; max abs error {out.max_abs_error:.3g}, float range "
                f"{out.float_max_abs:.3g}): {_LOW_FIDELITY_HINT}"
            )
        elif (
            out.worst_slice_cosine is not None
            and out.worst_slice_cosine < LOW_FIDELITY
            and (out.slice_peak_ratio or 1.0) >= DOMINATED
        ):
            report.warnings.append(
                f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
                f"as a whole, but its slice {out.worst_slice} along axis {out.slice_axis} only "
                f"at {out.worst_slice_cosine:.3f} (< {LOW_FIDELITY}), and its slices' float "
                f"peaks differ by {out.slice_peak_ratio:.3g}x: one cosine over an output is "
                "dominated by its largest values, so a small-valued part of it (such as a "
                f"detector's scores beside its boxes) can be lost unseen; {_LOW_FIDELITY_HINT}"
            )
        elif (
            out.compared == "cosine"
            and out.sample_cosine_mean is not None
            and out.sample_cosine_mean < LOW_FIDELITY
        ):
            report.warnings.append(
                f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
                f"over all held samples together, but at {out.sample_cosine_mean:.3f} per "
                f"sample on average (worst {out.worst_sample_cosine:.3f}, < {LOW_FIDELITY}): "
                "the samples with the largest outputs dominate one cosine over all of them, "
                f"and most others are lost; {_LOW_FIDELITY_HINT}"
            )
        elif out.compared == "cosine" and 0 < out.float_max_abs < out.max_abs_error:
            report.warnings.append(
                f"output {out.name!r} agrees with the float model at cosine {out.cosine:.3f} "
                f"as a whole, but some value is off by {out.max_abs_error:.3g}, more than the "
                f"largest float value ({out.float_max_abs:.3g}): a few positions (a token, a "
                f"row, a frame) are lost while the rest hide them; {_LOW_FIDELITY_HINT}"
            )
        elif out.top1_agreement is not None and out.top1_agreement < LOW_FIDELITY:
            report.warnings.append(
                f"output {out.name!r}: its largest class differs from the float model's in "
                f"{1 - out.top1_agreement:.1%} of its rows on the held batches (< "
                f"{LOW_FIDELITY:.0%} agree): {_LOW_FIDELITY_HINT}"
            )
        elif out.compared == "agreement" and out.cosine < 1.0:
            report.warnings.append(
                f"output {out.name!r} differs from the float model in "
                f"{1 - out.cosine:.1%} of its values on the held batches (integer output)"
            )
