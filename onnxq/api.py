"""The pipeline as one readable function: prepare, place (with calibration), compute ranges,
correct, materialize, verify, report.

Each stage is a function of its own module and returns data; :func:`quantize` wires them and
:func:`onnxq.messages.messages` turns their results into the report's warnings and notes.

Where things plug in: a float rewrite of the model (cross-layer equalization, SmoothQuant)
goes after ``prepare`` and before ``GraphFacts.of``; a weight-only pass that decides integer
weights (RTN, GPTQ, AWQ, AdaRound) after ``place`` and before ``materialize``; a
post-calibration correction next to ``bias_correction_pass``.  A pass returns its result as
data, which goes into :class:`onnxq.messages.Outcome` and the report.
"""

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
from onnxq.backends.target import profile_for, target_record
from onnxq.bias_correction import bias_correction_pass
from onnxq.calibrate import calibration_cache
from onnxq.config import QuantConfig
from onnxq.data import model_inputs, open_source
from onnxq.errors import CalibrationDataError, ConfigError, InternalError, OnnxqError, OutputError
from onnxq.materialize import materialize
from onnxq.measure import CachedStatistics, Calibration, held_batches
from onnxq.messages import GraphView, Outcome, messages, opset_conversion_hint
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import place
from onnxq.prepare import ModelLike, prepare
from onnxq.ranges import activation_ranges
from onnxq.recover.stages import Recovery, choose_weights, recalibrate, rewrite_float
from onnxq.report import Report
from onnxq.verify import float_reference, verify


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
    cfg = _config(config, backend, method, exclude, options)
    _check_sources(model, calibration, save_calibration, load_calibration)
    profile, profile_note = profile_for(cfg.target)
    prepared = prepare(model, profile, cfg.simplify)
    with _blame_conversion(prepared.load.opset_upgrade):
        graph = ir.Graph(prepared.model)
        inputs = model_inputs(graph)
        data = None
        if calibration is not None:
            data = open_source(calibration, inputs, batch_size, cfg.preprocess)
        recovery = Recovery()  # accuracy recovery (onnxq.recover): exact float rewrites first
        prepared.model = rewrite_float(
            prepared.model, profile, cfg.recovery, cfg.placement, cfg.calibration, data, inputs,
            recovery, cached=save_calibration is not None or load_calibration is not None,
        )  # fmt: skip
        graph = ir.Graph(prepared.model)
        facts, view = GraphFacts.of(graph, profile), GraphView.of(graph, profile)
        if load_calibration is not None:
            held = held_batches(prepared.model, data, inputs, cfg.fidelity_batches)
            measure: Calibration | CachedStatistics = CachedStatistics(
                load_calibration, graph, profile.name, held
            )
        else:
            assert data is not None
            saving = save_calibration is not None
            measure = Calibration(prepared.model, data, inputs, cfg.calibration, facts, saving)
        placement = place(facts, profile, cfg.placement, measure)
        annotations, statistics = placement.annotations, placement.statistics
        cache = None  # written last: a run that fails or is interrupted leaves no file
        if save_calibration is not None and load_calibration is None:
            cache = calibration_cache(
                statistics.stats,
                graph,
                profile.name,
                statistics.body_runs,
                statistics.unobservable,
            )
        ranges = activation_ranges(annotations, statistics.stats, profile, cfg.percentile)
        again = recalibrate(
            prepared.model, annotations, ranges.qparams, statistics, profile, cfg.recovery,
            cfg.calibration, cfg.weights, data, inputs, recovery,
            lambda measured: activation_ranges(
                annotations, measured.stats, profile, cfg.percentile
            ).qparams,
        )  # fmt: skip
        if again is not None:  # quantized-prefix ranges
            statistics = again
            ranges = activation_ranges(annotations, statistics.stats, profile, cfg.percentile)
        chosen = choose_weights(
            prepared.model, annotations, profile, cfg.recovery, cfg.calibration, cfg.weights,
            data, inputs, recovery,
        )  # fmt: skip
        bias = None
        if cfg.bias_correction and data is not None:
            bias = bias_correction_pass(
                prepared.model, annotations, profile, cfg.weights, data, inputs,
                cfg.max_batches, chosen,
            )  # fmt: skip
        # the float outputs first: their session is gone before the quantized model is built
        reference = float_reference(
            prepared.take_reference(), prepared.model, statistics.held, profile
        )
        placed = materialize(
            prepared.model, annotations, ranges.qparams, profile, cfg.weights, chosen
        )
        if ir.external.lazy_nbytes(prepared.model) < ir.external.LAZY_BYTES:
            ir.external.load_all(prepared.model)  # float weights that stayed float (biases)
        verification = verify(prepared.model, reference, statistics.held, profile)
    outcome = Outcome(
        config=cfg,
        profile=profile,
        profile_note=profile_note,
        prepared=prepared,
        graph=view,
        inputs=inputs,
        annotations=annotations,
        statistics=statistics,
        remarks=ranges.remarks,
        bias=bias,
        placed=placed,
        verification=verification,
        recovery=recovery,
    )
    report = _report(outcome)
    if save_calibration is not None and cache is not None:
        ir.atomic_write_bytes(save_calibration, cache)
    return QuantizedModel(prepared.model, report, prepared.source)


def _config(
    config: QuantConfig | str | os.PathLike[str] | dict[str, Any] | None,
    backend: str | None,
    method: str | None,
    exclude: Iterable[str] | None,
    options: dict[str, Any],
) -> QuantConfig:
    """The run's config: ``config`` with the keyword arguments of :func:`quantize` on top."""
    if isinstance(exclude, (str, os.PathLike)):
        exclude = [str(exclude)]  # one pattern, not its characters
    patterns = tuple(exclude) if exclude is not None else None
    return resolve_config(config, backend=backend, method=method, exclude=patterns, **options)


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
        bias_corrections=o.bias.corrections if o.bias is not None else [],
        recovery=o.recovery.to_dict() if o.recovery is not None else {},
        default_session=o.verification.default_session,
    )


def _check_sources(
    model: ModelLike,
    calibration: Any,
    save_calibration: str | os.PathLike[str] | None,
    load_calibration: str | os.PathLike[str] | None,
) -> None:
    """Refuse a run without data or statistics, and a cache that would overwrite an input."""
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


@contextlib.contextmanager
def _blame_conversion(upgrade: ir.OpsetUpgrade | None) -> Iterator[None]:
    """Note on an onnxruntime failure that the model ran only after onnxq converted its opset:
    onnx's version converter may be what broke it."""
    try:
        yield
    except (OnnxqError, InternalError) as exc:
        if upgrade is not None and exc.onnxruntime_failed:
            exc.add_note(opset_conversion_hint(upgrade))
        raise
