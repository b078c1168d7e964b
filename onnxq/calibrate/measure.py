"""The ways the placement loop (:func:`onnxq.place.loop.place`) gets statistics: calibrate on
data (:class:`Calibration`), read a calibration cache (:class:`CachedStatistics`), or none at
all where the kernels quantize activations at run time (:class:`RuntimeQuantization`).

Each is a callable ``measure(wanted) -> CalibrationResult`` over the activation tensors a
placement quantizes (name -> whether its method needs a histogram).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.calibrate.cache import cached_control_flow, cached_tensors, load_calibration
from onnxq.calibrate.engine import CalibrationResult, calibrate
from onnxq.config.calibration import CalibrationOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.errors import CalibrationDataError, InternalError
from onnxq.place.facts import GraphFacts
from onnxq.scale.executor import Executor


class Calibration:
    """Statistics from running the model on calibration data.

    The first call observes every wanted tensor and holds the first batches for the fidelity
    check; a later call observes only the tensors not observed yet, in one more pass when the
    data can be read again.  When it cannot (a generator), those tensors are
    ``unobservable``: they stay float; so are the tensors of a control-flow body that never ran
    on the data (``body_runs`` says how often each body ran).  ``all_histograms``: every
    tensor gets a histogram (a calibration cache then serves any method).  ``executor``
    (:mod:`onnxq.scale`): observe shards of the data there; the statistics are the same.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        data: Iterable[Any],
        inputs: list[InputSpec],
        options: CalibrationOptions,
        facts: GraphFacts,
        all_histograms: bool = False,
        executor: Executor | None = None,
    ) -> None:
        self._model, self._data, self._inputs = model, data, inputs
        self._executor = executor
        self._options, self._all_histograms = options, all_histograms
        self._channels = frozenset(facts.grouped_convs.values())
        self._positions = frozenset(facts.position_norm_convs.values())
        self._reiterable = iter(data) is not data
        self.result: CalibrationResult | None = None
        self._also: dict[str, bool] = {}

    def observe_also(self, names: Iterable[str]) -> None:
        """Observe the minimum and maximum of ``names`` too, in the first pass (the peaks a
        precision plan reads: ``onnxq.place.precision``); placement never asks for them."""
        self._also = dict.fromkeys(names, False)

    def __call__(self, wanted: Mapping[str, bool]) -> CalibrationResult:
        result = self.result
        asked = set(wanted)
        if result is None and self._also:
            wanted = {**self._also, **wanted}
        missing = {
            t: self._all_histograms or hist
            for t, hist in wanted.items()
            if result is None or (t not in result.stats and t not in result.unobservable)
        }
        if result is not None and missing and not self._reiterable:
            why = "was not observed (the calibration source can be read only once)"
            unobservable = {t: f"tensor {t!r} {why}" for t in missing}
            return _with(result, unobservable={**result.unobservable, **unobservable})
        if result is None and self._also:
            fresh = self._first_with_peaks(missing, asked)
            self.result = fresh
            return fresh
        if result is None or missing:
            fresh = self._observe(missing, hold=result is None)
            result = fresh if result is None else _merged(result, fresh)
        self.result = result
        return result

    def _first_with_peaks(self, wanted: dict[str, bool], asked: set[str]) -> CalibrationResult:
        """The first pass, with the tensors of :meth:`observe_also` too; when one of those
        has NaN/Inf values (a model whose own output overflows), the pass again without
        them (the data permitting), every one of them unobservable with the reason."""
        try:
            return self._observe(wanted, hold=True)
        except CalibrationDataError as exc:
            extra = [t for t in self._also if t not in asked]
            bad = [t for t in extra if f"tensor {t!r} has NaN or Inf" in str(exc)]
            if not bad or not self._reiterable:
                raise
        why = f"{bad[0]!r} has NaN or Inf values on the calibration data"
        placed = {t: h for t, h in wanted.items() if t in asked}
        first = self._observe(placed, hold=True)
        lost = {t: why for t in wanted if t not in asked}
        return _with(first, unobservable={**first.unobservable, **lost})

    def _observe(self, tensors: dict[str, bool], hold: bool) -> CalibrationResult:
        o = self._options
        return calibrate(
            self._model,
            tensors,
            self._data,
            self._inputs,
            max_batches=o.max_batches,
            hold=o.fidelity_batches if hold else 0,
            memory_budget=o.memory_budget_mb * 2**20,
            histogram_sample=o.histogram_sample,
            histogram_budget=o.histogram_budget,
            progress=o.progress,
            channels=self._channels,
            positions=self._positions,
            executor=self._executor,
        )


class CachedStatistics:
    """Statistics read from a calibration cache (``--load-calibration``); ``held``: batches
    of data kept for the fidelity check (none without data)."""

    def __init__(
        self, path: str | os.PathLike[str], graph: ir.Graph, backend: str, held: list[Batch]
    ) -> None:
        self._path, self._graph, self._backend, self._held = Path(path), graph, backend, held
        self._also: dict[str, bool] = {}
        self._uncached: dict[str, str] = {}

    def observe_also(self, names: Iterable[str]) -> None:
        """Read the statistics of ``names`` too, those the cache has (a cache saved from data
        has every float activation's when its run planned FP16)."""
        cached = cached_tensors(self._path)
        names = list(names)
        self._also = {n: False for n in names if n in cached}
        self._uncached = {
            n: "the calibration cache has no statistics for it (saved with high_precision fp32)"
            for n in names
            if n not in cached
        }

    def __call__(self, wanted: Mapping[str, bool]) -> CalibrationResult:
        wanted = {**self._also, **wanted}
        stats = load_calibration(self._path, self._graph, dict(wanted), self._backend)
        runs, unobserved = cached_control_flow(self._path)
        samples = max((s.samples for s in stats.values()), default=0)
        # no batch was calibrated here: the statistics come from the cache
        return CalibrationResult(
            stats,
            0,
            self._held,
            samples=samples,
            unobservable={
                **self._uncached,
                **{t: why for t, why in unobserved.items() if t in wanted},
            },
            body_runs=runs,
        )


class RuntimeQuantization:
    """No statistics: a dynamic profile's kernels quantize activations at run time, so the
    placement asks for none; ``held``: batches of data kept for the fidelity check (none
    without data)."""

    def __init__(self, held: list[Batch]) -> None:
        self._held = held

    def __call__(self, wanted: Mapping[str, bool]) -> CalibrationResult:
        if wanted:
            raise InternalError(
                f"a dynamic placement asked for statistics of {len(wanted)} tensor(s), e.g. "
                f"{next(iter(wanted))!r}; its kernels quantize activations at run time"
            )
        return CalibrationResult({}, 0, self._held)


def statistics_source(
    model: onnx.ModelProto,
    facts: GraphFacts,
    profile: BackendProfile,
    data: Iterable[Any] | None,
    inputs: list[InputSpec],
    options: CalibrationOptions,
    saving: bool,
    cache: str | os.PathLike[str] | None,
    executor: Executor | None = None,
) -> Calibration | CachedStatistics | RuntimeQuantization:
    """Where the placement loop gets its statistics: none for a dynamic profile (its kernels
    quantize at run time), the calibration ``cache`` when one is given, else the data (with a
    histogram for every tensor when ``saving`` a cache), observed on ``executor`` if given."""
    if profile.dynamic or cache is not None:
        held = held_batches(model, data, inputs, options.fidelity_batches)
        if profile.dynamic:
            return RuntimeQuantization(held)
        assert cache is not None
        return CachedStatistics(cache, facts.graph, profile.name, held)
    assert data is not None
    return Calibration(model, data, inputs, options, facts, saving, executor)


def held_batches(
    model: onnx.ModelProto, data: Iterable[Any] | None, inputs: list[InputSpec], count: int
) -> list[Batch]:
    """The first ``count`` batches of ``data``, checked against the model's inputs, for the
    fidelity check of a run whose statistics come from a cache (none without data)."""
    if data is None or not count:
        return []
    return calibrate(model, {}, data, inputs, max_batches=count, hold=count, progress=False).held


def _merged(first: CalibrationResult, extra: CalibrationResult) -> CalibrationResult:
    """``first`` with the statistics of a later pass over other tensors."""
    return CalibrationResult(
        {**first.stats, **extra.stats},
        first.batches_seen,
        first.held,
        first.sample_share,
        first.budget_sampled + extra.budget_sampled,
        first.samples,
        {**first.unobservable, **extra.unobservable},
        {**extra.body_runs, **first.body_runs},
    )


def _with(result: CalibrationResult, unobservable: dict[str, str]) -> CalibrationResult:
    return CalibrationResult(
        result.stats,
        result.batches_seen,
        result.held,
        result.sample_share,
        result.budget_sampled,
        result.samples,
        unobservable,
        result.body_runs,
    )
