"""Run-time validation: the quantized model must load and run in onnxruntime, and its outputs
are compared with the float model's on held calibration batches.

For a TensorRT-targeted model, onnxruntime's Q/DQ fusion is switched off (``fused=False``): its
fused int8 CPU kernels saturate on CPUs without VNNI, while TensorRT computes what the Q/DQ graph
itself says.  For the onnxruntime backend the fused kernels are what the user runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import onnx

from onnxq import ir
from onnxq.backends import output_metrics as metrics
from onnxq.backends.output_kinds import OutputKinds, score_axis, threshold_agreement
from onnxq.backends.runs import unpadded


@dataclass(frozen=True)
class OutputFidelity:
    """Agreement of one model output with the float model over the held batches."""

    name: str
    cosine: float  # for ``compared == "agreement"``: the share of values equal
    max_abs_error: float
    float_max_abs: float
    # "cosine" (float outputs, also sequences of {label: probability} maps), "agreement"
    # (integer/bool outputs must be equal), or why the output was not compared
    compared: str = "cosine"
    # values that are NaN/Inf in the float output (the cosine and the error cover the values
    # finite in both models), and values where exactly one model is finite or the two differ
    # in NaN/Inf
    nonfinite: int = 0
    nonfinite_mismatch: int = 0
    # for an output a Softmax/LogSoftmax produces: the share of its rows (along the normalised
    # axis) whose largest entry is the float model's; None for other outputs
    top1_agreement: float | None = None
    # an output of rank >= 3 is also compared slice by slice along its smallest axis after the
    # first (2-128 slices, each repeated over at least 8 values per sample: a detector's
    # [N, anchors, 4 + 1 + classes] columns, a segmentation map's channels): the worst slice's
    # cosine and index.  One cosine over the whole output is dominated by its largest values
    # (box coordinates), so it can stay high while a small-valued column (scores) is lost.
    # Not for a Softmax output (its top-1 agreement measures it).
    slice_axis: int | None = None
    slices: int = 0
    worst_slice: int | None = None
    worst_slice_cosine: float | None = None
    # the largest slice's peak |x| over the smallest non-zero one's, in the float model: from
    # 2 on, the larger slices dominate the whole cosine (output_metrics.DOMINATED)
    slice_peak_ratio: float | None = None
    # rows left out because the model's padding mask marks them as padding (a transformer's
    # padded tokens: whatever the float model computes there is read by nothing)
    padding_left_out: int = 0
    # the op that selected and ordered its rows (NonMaxSuppression: :func:`selected_outputs`);
    # then the comparison is position by position and says little
    selected_by: str | None = None
    # per sample (each item along the leading axis of every held batch), when there are two
    # or more: the mean and the worst cosine.  One cosine over all samples is dominated by the
    # samples with the largest outputs, which can hide that most others are lost.
    sample_cosine_mean: float | None = None
    worst_sample_cosine: float | None = None
    # the indices of the worst samples (over the held batches, in order), worst first
    worst_samples: tuple[int, ...] = ()
    # for a sigmoid output (:mod:`onnxq.backends.output_kinds`): the share of values on the
    # same side of ``threshold`` in both models
    threshold: float | None = None
    threshold_agreement: float | None = None

    def difference(self) -> str:
        """The comparison in a few words: ``cosine 0.930``, ``5.0% of its values differ``."""
        if self.compared == "cosine":
            return f"cosine {self.cosine:.3f}"
        if self.compared == "agreement":
            return f"{1 - self.cosine:.1%} of its values differ"
        return self.compared

    @property
    def why_not_compared(self) -> str | None:
        """Why the output was not compared (``compared`` holds it after :data:`NOT_COMPARED`),
        or None."""
        if not self.compared.startswith(NOT_COMPARED):
            return None
        return self.compared.removeprefix(NOT_COMPARED)

    @property
    def shape_changed(self) -> bool:
        """Whether the quantized model gave this output another number of values."""
        return self.compared.startswith(SHAPE_CHANGED)


# ``compared`` of an output that was not compared: this prefix, then why (the format is this
# module's own; OutputFidelity's properties read it)
NOT_COMPARED = "not compared: "
SHAPE_CHANGED = NOT_COMPARED + "the quantized model"  # how an output of another size reads


def class_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Graph outputs that a Softmax or LogSoftmax produces, with the axis it normalises (from
    opset 13 on; before, Softmax flattened the axes after it, and only a last axis counts)."""
    graph = ir.Graph(model)
    modern = ir.opset_version(model) >= 13
    out: dict[str, int] = {}
    for name in graph.graph_outputs:
        node = graph.producer.get(name)
        rank = len(graph.shape(name) or ())
        if node is None or not rank:
            continue
        if node.op_type in ("Softmax", "LogSoftmax"):
            axis = int(ir.node_attrs(node).get("axis", -1 if modern else 1))
            if modern or axis in (-1, rank - 1):
                out[name] = axis
        elif _flattened_softmax(graph, node, rank):
            out[name] = -1
    return out


SELECTING_OPS = frozenset({"NonMaxSuppression"})  # they pick and order rows by value


def selected_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """Graph outputs computed after an op that selects and orders rows by their values
    (NonMaxSuppression, also inside a Loop/If) -> that op type.  Their rows are the
    detections kept, in score order: the quantized model may keep others or order them
    differently, so comparing them position by position says little."""
    graph = ir.Graph(model)
    out: dict[str, str] = {}
    for name in graph.graph_outputs:
        found = _selected_by(graph, name)
        if found:
            out[name] = found
    return out


def _selected_by(graph: ir.Graph, output: str) -> str | None:
    found: list[str] = []

    def step(_tensor: str, node: onnx.NodeProto | None) -> list[str]:
        if node is None or found:
            return []
        hits = ({node.op_type} | ir.inner_op_types(node)) & SELECTING_OPS
        if hits:
            found.append(sorted(hits)[0])
            return []
        return [x for x in node.input if x]

    graph.walk_up([output], step)
    return found[0] if found else None


def _flattened_softmax(graph: ir.Graph, node: onnx.NodeProto, rank: int) -> bool:
    """``Reshape(Softmax(Flatten(x, axis=rank-1)), Shape(x))``: a last-axis softmax as onnx's
    version converter writes an opset-11 Softmax for opset 13."""
    if node.op_type != "Reshape" or len(node.input) < 2:
        return False
    soft = graph.producer.get(node.input[0])
    if (
        soft is None
        or soft.op_type not in ("Softmax", "LogSoftmax")
        or int(ir.node_attrs(soft).get("axis", -1)) not in (-1, 1)
    ):
        return False
    flat = graph.producer.get(soft.input[0])
    shape = graph.producer.get(node.input[1])
    return (
        flat is not None
        and flat.op_type == "Flatten"
        and int(ir.node_attrs(flat).get("axis", 1)) == rank - 1
        and shape is not None
        and shape.op_type == "Shape"
        and not ir.node_attrs(shape)  # no start/end: the whole shape
        and shape.input[0] == flat.input[0]
    )


def fidelity(
    reference: list[dict[str, np.ndarray]],
    quantized: list[dict[str, np.ndarray]],
    axes: dict[str, int] | None = None,
    masks: list[np.ndarray | None] | None = None,
    kinds: OutputKinds | None = None,
) -> list[OutputFidelity]:
    """Cosine similarity and max absolute error per output, over all batches; for the outputs
    in ``axes`` (name -> class axis, :func:`class_axes`) also the top-1 agreement along it.
    ``masks`` (:func:`padding_masks`, one per batch): an output of rank >= 3 whose leading
    axes are the mask's is compared on its unpadded rows only."""
    return [
        _output_fidelity(name, reference, quantized, axes, masks, kinds)
        for name in (reference[0] if reference else [])
    ]


def _output_fidelity(
    name: str,
    reference: list[dict[str, np.ndarray]],
    quantized: list[dict[str, np.ndarray]],
    axes: dict[str, int] | None,
    masks: list[np.ndarray | None] | None,
    kinds: OutputKinds | None,
) -> OutputFidelity:
    """The fidelity of output ``name`` over all batches (see :func:`fidelity`)."""
    ref = [metrics.as_array(r[name]) for r in reference]
    got = [metrics.as_array(q[name]) for q in quantized]
    if any(v is None for v in ref + got):
        kind = type(reference[0][name]).__name__
        return OutputFidelity(
            name, 0.0, 0.0, 0.0, f"{NOT_COMPARED}a {kind} output, not a numeric tensor"
        )
    ref_arrays, got_arrays = cast(list[np.ndarray], ref), cast(list[np.ndarray], got)
    if not all(np.issubdtype(r.dtype, np.floating) for r in ref_arrays):
        return OutputFidelity(
            name, metrics.agreement(ref_arrays, got_arrays), 0.0, 0.0, "agreement"
        )
    class_axis = (axes or {}).get(name)
    if class_axis is None and kinds is not None:
        class_axis = score_axis(ref_arrays, name in kinds.logits)
    ref_arrays, padded = unpadded(ref_arrays, masks)
    if padded:  # [batch, sequence, ...] became [rows, ...]
        got_arrays, _ = unpadded(got_arrays, masks)
        if class_axis is not None and class_axis >= 0:
            class_axis = class_axis - 1 if class_axis >= 2 else None
    top1 = metrics.top1(ref_arrays, got_arrays, class_axis)
    result, compared = _value_fidelity(name, ref_arrays, got_arrays, top1, padded)
    if not compared:
        return result
    clean = not (result.nonfinite or result.nonfinite_mismatch)
    per_sample = metrics.sample_cosines(ref_arrays, got_arrays) if clean and not padded else None
    if per_sample is not None:
        result = replace(
            result,
            sample_cosine_mean=round(float(per_sample.mean()), 6),
            worst_sample_cosine=round(float(per_sample.min()), 6),
            worst_samples=tuple(int(i) for i in np.argsort(per_sample, kind="stable")[:3]),
        )
    if kinds is not None and name in kinds.sigmoids:
        result = replace(
            result,
            threshold=kinds.threshold,
            threshold_agreement=threshold_agreement(ref_arrays, got_arrays, kinds.threshold),
        )
    sliced = metrics.slice_cosines(ref_arrays, got_arrays) if clean and top1 is None else None
    return result if sliced is None else _with_slices(result, sliced)


def _value_fidelity(
    name: str,
    ref_arrays: list[np.ndarray],
    got_arrays: list[np.ndarray],
    top1: float | None,
    padded: int,
) -> tuple[OutputFidelity, bool]:
    """Cosine, max error and peak of one float output over its finite values (the non-finite
    ones counted, and those where the two models differ), and whether the values could be
    compared at all (False: the quantized model gives another number of values)."""
    a, b = metrics.flat64(ref_arrays), metrics.flat64(got_arrays)
    nonfinite = mismatch = 0
    if a.shape != b.shape:
        changed = f"{SHAPE_CHANGED} gives {b.size} values, the float model {a.size}"
        return OutputFidelity(name, 0.0, 0.0, 0.0, changed), False
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.all():
        same = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
        nonfinite = int((~np.isfinite(a)).sum())
        mismatch = int((~finite & ~same).sum())
        a, b = a[finite], b[finite]
    del finite
    err, peak = metrics.abs_max(a, b), metrics.abs_max(a)
    cos = metrics.cosine(a, b, overwrite=True)
    del a, b  # an LM's logits: float64 copies of hundreds of MB
    result = OutputFidelity(
        name,
        round(cos, 6),
        err,
        peak,
        nonfinite=nonfinite,
        nonfinite_mismatch=mismatch,
        top1_agreement=top1,
        padding_left_out=padded,
    )
    return result, True


def _with_slices(
    result: OutputFidelity, sliced: tuple[int, np.ndarray, np.ndarray]
) -> OutputFidelity:
    """``result`` with its worst slice along the axis :func:`metrics.slice_cosines` chose."""
    axis, cosines, peaks = sliced
    k = int(np.argmin(cosines))
    nonzero = peaks[peaks > 0]
    ratio = float(nonzero.max() / nonzero.min()) if nonzero.size else 1.0
    return replace(
        result,
        slice_axis=axis,
        slices=len(cosines),
        worst_slice=k,
        worst_slice_cosine=round(float(cosines[k]), 6),
        slice_peak_ratio=round(ratio, 3),
    )
