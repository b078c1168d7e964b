"""What the output-driven range search (:mod:`onnxq.recover.rangesearch`) measures: the float
outputs of the calibration batches, a Q/DQ model cut after one activation (the part before
runs once per batch, the part after once per candidate range), and the per-sample output
error of each candidate."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends.runs import padding_masks
from onnxq.config.calibration import CalibrationOptions
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import check_batch
from onnxq.ir.split import cut_after
from onnxq.numerics.qparams import QParams
from onnxq.recover.outputs import pruned_session, run_session, without_padding
from onnxq.recover.rangegrid import Candidate

STEP = "the range search"  # what a failure of its onnxruntime sessions names


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
        session = pruned_session(model, None, "float", step=STEP)
        limits = [n for n in (calibration.max_batches, max_batches) if n is not None]
        limit = min(limits) if limits else None
        names = [o.name for o in model.graph.output]
        budget, used = calibration.memory_budget_mb * 2**20, 0
        self._kept: list[tuple[int, Batch, dict[str, np.ndarray]]] = []
        for index, raw in enumerate(data):
            if limit is not None and index >= limit:
                break
            batch = check_batch(raw, inputs, index)
            outputs = dict(zip(names, run_session(session, None, batch, index, STEP), strict=True))
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
                got = run_session(self._suffix, None, feeds, index, STEP)
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
            fetched = dict(
                zip(
                    self._fetched,
                    run_session(self._prefix, None, batch, index, STEP, as_float64=False),
                    strict=True,
                )
            )
        feeds = {}
        for name in self.cut.boundary:
            source = self._tensor if name == self._dequantized else name
            feeds[name] = fetched[source] if source in fetched else batch[source]
        return feeds


def _session(model: onnx.ModelProto, what: str) -> Any:
    """An unoptimized onnxruntime session of one part of a Q/DQ copy of the model."""
    return pruned_session(model, None, f"Q/DQ ({what})", step=STEP)


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
    got, want = without_padding(got, want, padding)
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


__all__ = ["FloatOutputs", "SuffixRunner", "fake_quantize", "sample_errors"]
