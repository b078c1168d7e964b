"""Output-driven range search: each activation's clip range chosen by the model's output error,
one tensor at a time in graph order (``range_search: true``).

An observer (and quantized-prefix calibration) picks each activation's range from that
tensor's own values: the error it minimises, or the share it keeps, is local.  What matters is
the model's output: a range clipped 20% tighter costs a few large values and gives every other
value a finer step, and which way that goes depends on what the layers after it do with them.
Here, for each quantized activation in graph order, with every earlier range already chosen,
the current range (``f = 1``) and a small grid of others (the current one times each of
:data:`FACTORS`, and the ``mse`` observer's range of the same statistics) are tried, and the
one with the least model output error (per output, the squared error over the float output's
squared norm, summed over the outputs) on the even calibration batches is taken; it is kept
only if it also lowers that error on the odd batches (the pattern of sequential AdaRound and
sequential bias correction).  A range never passes the bounds its readers saturate at.

Cost, per tensor: the Q/DQ model up to the tensor runs once per calibration batch (its
activations, and whatever else the rest of the model reads from before it, are the inputs of
the rest: :func:`onnxq.ir.split.cut_after`), and the rest of the model once per candidate on
each even batch and twice on each odd one when a candidate wins there, all streamed one batch
at a time.  About ``(1 + candidates / 2)`` passes over the data per tensor (the part after a
tensor is on average half the model); the float outputs of the calibration batches are kept
under ``memory_budget_mb`` (later batches are not used).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.backends.runs import padding_masks
from onnxq.data import check_batch
from onnxq.errors import InternalError, UnsupportedModelError, one_line
from onnxq.inputs import Batch, InputSpec
from onnxq.ir.split import cut_after
from onnxq.observers import MethodOptions
from onnxq.options import CalibrationOptions, WeightOptions
from onnxq.place.annotations import Annotations, TensorAnnotation
from onnxq.precisions import tensor_qtype
from onnxq.progress import counted
from onnxq.qparams import QParams, activation_qparams
from onnxq.recover.outputs import pruned_session, run_session
from onnxq.recover.rangegrid import Candidate, Grid, candidates
from onnxq.tensor_stats import TensorStats

FACTORS = (1.2, 0.9, 0.8, 0.7, 0.6, 0.5)  # the current range times each, besides 1 and mse
# a range is kept when its gain on the judging batches exceeds this many standard errors
MIN_SIGNIFICANCE = 2.0


@dataclass(frozen=True)
class RangeChoice:
    """One tensor: the range tried best on the fitting batches (``label``: ``x0.8``, ``mse``,
    ``x1`` when the current one stayed best), the model's output error with the current
    range and that one on the fitting and the judging batches, and whether it was kept."""

    tensor: str
    label: str
    factor: float  # the chosen range's high end over the current one's
    low: float
    high: float
    fit_before: float
    fit_after: float
    judge_before: float | None = None  # None: nothing better on the fitting batches
    judge_after: float | None = None
    kept: bool = False

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "tensor": self.tensor,
            "candidate": self.label,
            "factor": round(self.factor, 4),
            "range": [_g(self.low), _g(self.high)],
            "error_fit": [_g(self.fit_before), _g(self.fit_after)],
            "error_judge": [_g(self.judge_before), _g(self.judge_after)],
            "kept": self.kept,
        }


def _g(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def search_ranges(
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    stats: dict[str, TensorStats],
    profile: BackendProfile,
    weights: WeightOptions,
    calibration: CalibrationOptions,
    reference: FloatOutputs,
) -> tuple[dict[str, QParams], list[RangeChoice]]:
    """The activation ranges of ``model`` (the float model, not edited) chosen one tensor at
    a time in graph order by the model's output error against ``reference`` (``qparams``:
    the observers' ranges, where every search starts; returned with the kept changes), and
    one record per tensor searched, in graph order."""
    from onnxq.materialize import materialize

    current = dict(qparams)
    done: list[RangeChoice] = []
    order = _in_graph_order(model, annotations, current)
    for ann in counted(order, "range search", calibration.progress, len(order), unit="tensor"):
        spec = _grid_of(ann, profile)
        grid = candidates(
            current[ann.tensor], FACTORS, spec, ann.bounds, _mse_range(ann, spec, stats)
        )
        if len(grid) < 2:
            continue
        quantized = onnx.ModelProto()
        quantized.CopyFrom(model)
        materialize(quantized, annotations, current, profile, weights)
        site = SuffixRunner.at(quantized, ann.tensor)
        if site is None:
            continue
        choice = _choose(site, grid, reference, ann.tensor)
        if choice.kept:
            current[ann.tensor] = grid[[c.label for c in grid].index(choice.label)].qparams
        done.append(choice)
    return current, done


def _choose(
    site: SuffixRunner, grid: list[Candidate], reference: FloatOutputs, tensor: str
) -> RangeChoice:
    """The best of ``grid`` (the current range first) on the even batches, judged on the
    odd ones (:func:`significantly_lower`)."""
    fit = site.errors(grid, reference.batches(0)).mean(axis=1)
    best = int(np.argmin(fit))
    chosen = grid[best]
    record = RangeChoice(
        tensor, chosen.label, chosen.factor, chosen.qparams.low, chosen.qparams.high,
        float(fit[0]), float(fit[best]),
    )  # fmt: skip
    if best == 0:
        return record
    judged = site.errors([grid[0], chosen], reference.batches(1))
    before, after = (float(v) for v in judged.mean(axis=1))
    return replace(
        record, judge_before=before, judge_after=after,
        kept=significantly_lower(judged[1], judged[0]),
    )  # fmt: skip


def significantly_lower(new: np.ndarray, old: np.ndarray) -> bool:
    """Whether the per-batch errors ``new`` are lower than ``old`` (paired, batch by batch)
    by more than :data:`MIN_SIGNIFICANCE` standard errors of their mean difference (with one
    batch: lower at all)."""
    gain = old - new
    if gain.size < 2:
        return bool(gain.sum() > 0)
    spread = float(gain.std(ddof=1)) / np.sqrt(gain.size)
    return bool(gain.mean() > MIN_SIGNIFICANCE * spread) and bool(gain.mean() > 0)


def _grid_of(ann: TensorAnnotation, profile: BackendProfile) -> Grid:
    """``ann``'s element type, symmetry and bits, as :mod:`onnxq.ranges` gives them."""
    qtype = tensor_qtype("activation", ann.settings.precision, profile.activation_dtype)
    symmetric = ann.settings.symmetric
    symmetric = profile.activation_symmetric if symmetric is None else symmetric
    return Grid(qtype.name, symmetric, ann.settings.bits)


def _mse_range(ann: TensorAnnotation, grid: Grid, stats: dict[str, TensorStats]) -> QParams | None:
    """The ``mse`` observer's range of ``ann``'s statistics (None: no histogram)."""
    seen = stats.get(ann.tensor)
    if seen is None or not seen.histogram or seen.count == 0:
        return None
    return activation_qparams(
        seen, "mse", grid.dtype, grid.symmetric, MethodOptions(), grid.bits, ann.bounds
    )


def _in_graph_order(
    model: onnx.ModelProto, annotations: Annotations, qparams: dict[str, QParams]
) -> list[TensorAnnotation]:
    """The annotated activations that have integer qparams, by their producer's place in
    ``model`` (graph inputs first)."""
    place = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    anns = [
        a
        for a in annotations.of_kind("activation")
        if a.tensor in qparams and qparams[a.tensor].zero_point.dtype.kind in "iu"
    ]
    return sorted(anns, key=lambda a: place.get(a.tensor, -1))


class FloatOutputs:
    """The calibration batches and the float model's outputs on them (by output name), as
    many batches as fit ``memory_budget_mb`` (at least two), of the first ``max_batches``
    and ``calibration.max_batches``."""

    def __init__(
        self,
        model: onnx.ModelProto,
        data: Iterable[Batch],
        inputs: list[InputSpec],
        calibration: CalibrationOptions,
        max_batches: int | None = None,
    ) -> None:
        session = pruned_session(model, None, "float")
        limits = [n for n in (calibration.max_batches, max_batches) if n is not None]
        limit = min(limits) if limits else None
        names = [o.name for o in model.graph.output]
        budget, used = calibration.memory_budget_mb * 2**20, 0
        self._kept: list[tuple[int, Batch, dict[str, np.ndarray]]] = []
        for index, raw in enumerate(data):
            if limit is not None and index >= limit:
                break
            batch = check_batch(raw, inputs, index)
            outputs = dict(zip(names, run_session(session, None, batch, index), strict=True))
            used += sum(o.nbytes for o in outputs.values())
            if index >= 2 and used > budget:
                break
            self._kept.append((index, batch, outputs))

    @property
    def judging(self) -> bool:
        """Whether some batch judges (an odd one) and some batch chooses (an even one)."""
        return {index % 2 for index, _, _ in self._kept} == {0, 1}

    def batches(self, parity: int) -> Iterator[tuple[int, Batch, dict[str, np.ndarray]]]:
        """(index, batch, float outputs) of the kept batches whose index has ``parity``."""
        return (kept for kept in self._kept if kept[0] % 2 == parity)


class SuffixRunner:
    """A Q/DQ model cut after one activation's DequantizeLinear: the part before runs once per
    batch; the part after once per candidate range, fed the activation quantized in numpy."""

    def __init__(self, quantized: onnx.ModelProto, tensor: str, dequantized: str) -> None:
        graph = ir.Graph(quantized)
        self.cut = cut_after(quantized, dequantized, graph.value_info)
        self._tensor, self._dequantized = tensor, dequantized
        given = {i.name for i in quantized.graph.input}
        wanted = [tensor if b == dequantized else b for b in self.cut.boundary]
        self._fetched = [b for b in dict.fromkeys(wanted) if b not in given]
        self._prefix: Any = None
        if self._fetched:
            outs = [graph.value_info(b) for b in self._fetched]
            with ir.pruned(quantized, self._fetched), ir.with_outputs(quantized, outs) as view:
                self._prefix = _session(view, "the part before the tensor")
        self._suffix = _session(self.cut.suffix, "the part after the tensor")

    @classmethod
    def at(cls, quantized: onnx.ModelProto, tensor: str) -> SuffixRunner | None:
        """The runner for ``tensor``'s Q/DQ pair in ``quantized`` (None: not one pair in the
        top graph, or no graph output depends on it)."""
        nodes = quantized.graph.node
        quantizers = [n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == tensor]
        if len(quantizers) != 1:
            return None
        readers = [n for n in nodes if quantizers[0].output[0] in n.input]
        if len(readers) != 1 or readers[0].op_type != "DequantizeLinear":
            return None
        runner = cls(quantized, tensor, readers[0].output[0])
        if not runner.cut.outputs or runner._dequantized not in runner.cut.boundary:
            return None
        return runner

    def errors(
        self,
        grid: list[Candidate],
        batches: Iterable[tuple[int, Batch, dict[str, np.ndarray]]],
    ) -> np.ndarray:
        """The output error of each candidate on each of ``batches`` (candidates x batches):
        per output, the mean over the batch's samples (the leading axis) of the squared
        difference from float over the float squared norm (:func:`sample_errors`; padded
        positions left out), summed over the outputs."""
        columns = []
        for index, batch, want in batches:
            feeds = self._boundary(batch, index)
            value = feeds.pop(self._dequantized)
            padding = padding_masks([batch])[0]
            column = np.zeros(len(grid))
            for k, candidate in enumerate(grid):
                feeds[self._dequantized] = fake_quantize(value, candidate.qparams)
                got = run_session(self._suffix, None, feeds, index)
                column[k] = sum(
                    float(sample_errors(got[j], want[name], padding).mean())
                    for j, name in enumerate(self.cut.outputs)
                )
            columns.append(column)
        return np.stack(columns, axis=1) if columns else np.zeros((len(grid), 0))

    def _boundary(self, batch: Batch, index: int) -> dict[str, np.ndarray]:
        """The suffix's inputs on ``batch`` (the activation before quantization under its
        DequantizeLinear's name)."""
        fetched = {}
        if self._prefix is not None:
            fetched = dict(zip(self._fetched, _run_as_is(self._prefix, batch, index), strict=True))
        feeds = {}
        for name in self.cut.boundary:
            source = self._tensor if name == self._dequantized else name
            feeds[name] = fetched[source] if source in fetched else batch[source]
        return feeds


def _session(model: onnx.ModelProto, what: str) -> Any:
    """An unoptimized onnxruntime session of one part of a Q/DQ copy of the model."""
    from onnxq.calibration_session import make_session

    try:
        return make_session(model, optimize=False)
    except UnsupportedModelError as exc:  # the float model itself loaded for calibration
        raise InternalError(
            f"onnxruntime cannot load {what} of onnxq's Q/DQ copy of the model for the range "
            f"search: {exc}",
            onnxruntime_failed=True,
        ) from None


def _run_as_is(session: Any, batch: Batch, index: int) -> list[np.ndarray]:
    """Every output of ``session`` on ``batch``, in the types the model gives them (they feed
    the part after the cut)."""
    try:
        return [np.asarray(v) for v in session.run(None, batch)]
    except Exception as exc:  # the float model ran on this batch during calibration
        raise InternalError(
            f"onnxruntime fails on onnxq's Q/DQ copy of the model for the range search on "
            f"calibration batch {index}: {one_line(exc)}",
            onnxruntime_failed=True,
        ) from None


def sample_errors(
    got: np.ndarray, want: np.ndarray, padding: np.ndarray | None = None
) -> np.ndarray:
    """Per sample (the leading axis; a scalar is one), the squared difference of ``got`` from
    ``want`` over ``want``'s squared norm (the squared difference alone where that is 0).
    ``padding``: the batch's padding mask ([batch, sequence], False = padding,
    :func:`onnxq.backends.runs.padding_masks`); an output whose two leading axes it matches
    is compared on the unpadded positions only (what a padded position holds is noise)."""
    if want.ndim == 0:
        got, want = got.reshape(1), want.reshape(1)
    if padding is not None and want.ndim >= 3 and want.shape[:2] == padding.shape:
        keep = padding.reshape(padding.shape + (1,) * (want.ndim - 2))
        got, want = np.where(keep, got, 0.0), np.where(keep, want, 0.0)
    diff = np.square(got - want).reshape(want.shape[0], -1).sum(axis=1)
    norm = np.square(want).reshape(want.shape[0], -1).sum(axis=1)
    return diff / np.where(norm > 0, norm, 1.0)


def fake_quantize(value: np.ndarray, qp: QParams) -> np.ndarray:
    """``value`` through QuantizeLinear and DequantizeLinear with ``qp`` (per tensor, an
    integer type), as onnxruntime computes them in float32."""
    info = np.iinfo(qp.zero_point.dtype)
    scale = np.float32(qp.scale)
    zero = np.float32(qp.zero_point)
    q = np.clip(np.rint(value.astype(np.float32) / scale) + zero, info.min, info.max)
    return ((q - zero) * scale).astype(np.float32)


__all__ = [
    "FACTORS",
    "FloatOutputs",
    "RangeChoice",
    "SuffixRunner",
    "fake_quantize",
    "sample_errors",
    "search_ranges",
    "significantly_lower",
]
