"""Per-layer statistics of a layer's inputs, streamed through onnxruntime in bounded memory.

A reconstruction algorithm (AdaRound) needs, for each layer, how its output changes when its
weight does: for rows ``x`` of the input (:mod:`onnxq.recover.layers`) that is the second
moment ``E[x x^T]`` (and, to compare against the float model, ``E[x_q x_f^T]`` with ``x_q``
the input in the quantized model and ``x_f`` in the float model).  :func:`capture_grams` runs
both models batch by batch on the same data, cuts each exposed input into rows, keeps a fixed
sample of them (:func:`row_sample`) and adds their products into one ``[groups, K, K]`` sum
per layer; nothing of a batch outlives it.  When the layers' sums and sampled rows would pass
the memory budget, the layers are taken in groups, one pass over the data each (one batch of
the exposed inputs comes on top, as in a calibration pass).

:func:`paired_batches` is the streaming core, for any per-layer measurement that compares the
float model with a quantized one on the same batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxq import ir
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import batches_total, check_batch
from onnxq.errors import CalibrationDataError
from onnxq.recover.layers import LinearLayer
from onnxq.runtime.progress import counted

DEFAULT_BATCHES = 64  # assumed when the source does not say how many batches it holds


@dataclass
class GramStats:
    """Sums over the sampled rows of one layer's input: ``qq = sum x_q x_q^T``, ``qf = sum
    x_q x_f^T`` and ``ff = sum x_f x_f^T`` (float64, ``[groups, K, K]``; ``qf``/``ff`` are
    None when only one model was captured), how many rows went in, and the sums of the rows
    themselves (``[groups, K]``: ``q_sum`` of ``x_q``, ``f_sum`` of ``x_f`` when captured)."""

    qq: np.ndarray
    qf: np.ndarray | None = None
    ff: np.ndarray | None = None
    rows: int = 0
    q_sum: np.ndarray | None = None
    f_sum: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.qq, self.qf, self.ff) if a is not None)


@dataclass
class GramAccumulator:
    """The :class:`GramStats` of one layer, summed batch by batch over a fixed sample of
    ``per_batch`` rows (:func:`row_sample`, the same rows of the float and quantized inputs)."""

    layer: LinearLayer
    float_name: str
    quant_name: str | None
    per_batch: int
    stats: GramStats | None = None
    seen: list[int] = field(default_factory=list)

    def add(self, index: int, x_float: np.ndarray, x_quant: np.ndarray | None) -> None:
        take = row_sample(self.layer.positions(x_float), self.per_batch, index)
        f = self.layer.rows(x_float, take).astype(np.float64)
        ft = f.transpose(0, 2, 1)
        if x_quant is None:
            self._sum(GramStats(ft @ f, None, None, f.shape[1], f.sum(axis=1)))
            return
        q = self.layer.rows(x_quant, take).astype(np.float64)
        qt = q.transpose(0, 2, 1)
        self._sum(GramStats(qt @ q, qt @ f, ft @ f, f.shape[1], q.sum(axis=1), f.sum(axis=1)))

    def _sum(self, batch: GramStats) -> None:
        if self.stats is None:
            self.stats = batch
            return
        s = self.stats
        for name in ("qq", "qf", "ff", "q_sum", "f_sum"):
            mine, more = getattr(s, name), getattr(batch, name)
            if mine is not None and more is not None:
                mine += more
        s.rows += batch.rows


def row_sample(positions: int, budget: int, index: int) -> np.ndarray | None:
    """Flat indices of at most ``budget`` of ``positions`` rows, evenly spaced, starting at an
    offset that moves with the batch ``index`` (so a fixed image region is not always the one
    kept); None: take every row."""
    if positions <= budget:
        return None
    stride = positions // budget
    start = (index * 7919) % stride
    return np.arange(start, positions, stride, dtype=np.int64)[:budget]


def capture_grams(
    float_model: onnx.ModelProto,
    layers: list[LinearLayer],
    data: Iterable[Batch],
    inputs: list[InputSpec],
    *,
    quant_model: onnx.ModelProto | None = None,
    quant_inputs: dict[str, str] | None = None,
    rows_per_layer: int = 4096,
    max_batches: int | None = None,
    memory_budget: int = 2**30,
    progress: bool = True,
) -> dict[str, GramStats]:
    """:class:`GramStats` per layer (by node name) over the batches of ``data``.

    ``quant_model`` (optional): the same model with Q/DQ; ``quant_inputs`` maps each layer's
    node name to the tensor it reads there (its input's DequantizeLinear output).  Without it
    only ``qq`` is filled, from the float model.  ``rows_per_layer``: rows kept per layer over
    the whole calibration (a share of them from every batch).
    """
    per_batch = _rows_per_batch(data, rows_per_layer, max_batches)
    out: dict[str, GramStats] = {}
    groups = _groups(layers, per_batch, memory_budget)
    if len(groups) > 1 and iter(data) is data:  # type: ignore[comparison-overlap]
        raise CalibrationDataError(
            f"capturing {len(layers)} layers needs {len(groups)} passes over the data (memory "
            "budget), but the calibration source can be read only once; pass a folder or a list"
        )
    for gi, group in enumerate(groups):
        accs = [
            GramAccumulator(
                layer,
                layer.input,
                None if quant_inputs is None else quant_inputs[layer.node],
                per_batch,
            )
            for layer in group
        ]
        f_names = sorted({a.float_name for a in accs})
        q_names = sorted({a.quant_name for a in accs if a.quant_name is not None})
        label = "capturing" if len(groups) == 1 else f"capturing {gi + 1}/{len(groups)}"
        for index, f_vals, q_vals in paired_batches(
            float_model,
            f_names,
            data,
            inputs,
            quant_model=quant_model if q_names else None,
            quant_names=q_names,
            max_batches=max_batches,
            progress=progress,
            label=label,
        ):
            for acc in accs:
                x_q = q_vals.get(acc.quant_name) if acc.quant_name is not None else None
                acc.add(index, f_vals[acc.float_name], x_q)
        for acc in accs:
            if acc.stats is not None:
                out[acc.layer.node] = acc.stats
    return out


def _rows_per_batch(data: Iterable[Batch], rows_per_layer: int, max_batches: int | None) -> int:
    """The rows each batch gives each layer: ``rows_per_layer`` spread over the batches the
    calibration holds (:data:`DEFAULT_BATCHES` when the source does not say)."""
    total = batches_total(data)
    total = min(total, max_batches) if total and max_batches else (total or max_batches)
    return max(1, math.ceil(rows_per_layer / (total or DEFAULT_BATCHES)))


def channel_peaks(
    model: onnx.ModelProto,
    tensors: list[str],
    data: Iterable[Batch],
    inputs: list[InputSpec],
    *,
    axis: int,
    label: str,
    max_batches: int | None = None,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """max |x_c| over the calibration data, per tensor and channel along ``axis`` (float64)."""
    peaks: dict[str, np.ndarray] = {}
    for _, values, _ in paired_batches(
        model, tensors, data, inputs, max_batches=max_batches, progress=progress, label=label
    ):
        for name, value in values.items():
            moved = np.moveaxis(np.abs(value), axis, 0)
            peak = moved.reshape(moved.shape[0], -1).max(axis=1).astype(np.float64)
            peaks[name] = peak if name not in peaks else np.maximum(peaks[name], peak)
    return peaks


def paired_batches(
    float_model: onnx.ModelProto,
    float_names: list[str],
    data: Iterable[Batch],
    inputs: list[InputSpec],
    *,
    quant_model: onnx.ModelProto | None = None,
    quant_names: list[str] | None = None,
    max_batches: int | None = None,
    progress: bool = True,
    label: str = "capturing",
) -> Iterator[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Per batch: its index, ``float_names`` from the float model and ``quant_names`` from
    ``quant_model`` (Q/DQ arithmetic as written: onnxruntime's fusion off), on the same batch.
    One batch of values is alive at a time."""
    from onnxq.calibrate.session import augmented_session, run_batch

    f_session = augmented_session(float_model, ir.Graph(float_model), float_names)
    q_session = None
    if quant_model is not None and quant_names:
        q_session = augmented_session(
            quant_model, ir.Graph(quant_model), quant_names, optimize=False
        )
    batches: Iterable[Batch] = data
    total = batches_total(data)
    if max_batches is not None:
        total = min(total, max_batches) if total is not None else max_batches
    for index, raw in enumerate(counted(batches, label, progress, total)):
        if max_batches is not None and index >= max_batches:
            break
        batch = check_batch(raw, inputs, index)
        f_vals = dict(
            zip(float_names, run_batch(f_session, float_names, batch, index), strict=True)
        )
        q_vals: dict[str, np.ndarray] = {}
        if q_session is not None and quant_names:
            quantized = run_batch(q_session, quant_names, batch, index, "quantized")
            q_vals = dict(zip(quant_names, quantized, strict=True))
        yield index, f_vals, q_vals


def _groups(layers: list[LinearLayer], per_batch: int, budget: int) -> list[list[LinearLayer]]:
    """Layers in groups whose sums (three ``[G, K, K]`` float64) and sampled rows fit
    ``budget`` bytes; a layer alone over it still gets a group of its own."""
    groups: list[list[LinearLayer]] = [[]]
    used = 0
    for layer in layers:
        k = layer.row_length
        size = 3 * 8 * layer.groups * k * k + 2 * 8 * layer.groups * per_batch * k
        if groups[-1] and used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(layer)
        used += size
    return [g for g in groups if g]
