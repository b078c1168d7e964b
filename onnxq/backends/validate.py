"""Run-time validation: the quantized model must load and run in onnxruntime, and its outputs
are compared with the float model's on held calibration batches.

For a TensorRT-targeted model, onnxruntime's Q/DQ fusion is switched off (``fused=False``): its
fused int8 CPU kernels saturate on CPUs without VNNI, while TensorRT computes what the Q/DQ graph
itself says.  For the onnxruntime backend the fused kernels are what the user runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import onnx

from onnxq import device, ir
from onnxq.backends.output_kinds import OutputKinds, score_axis, threshold_agreement
from onnxq.errors import InternalError, UnsupportedModelError, one_line
from onnxq.heap import release_free_memory
from onnxq.inputs import Batch


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
    # 2 on, the larger slices dominate the whole cosine (:data:`DOMINATED`)
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


def padding_masks(batches: list[dict[str, Any]]) -> list[np.ndarray | None]:
    """Per batch, its padding mask: an integer or bool input of rank 2 named like
    ``attention_mask`` ([batch, sequence], 0 = padding), else None."""
    masks: list[np.ndarray | None] = []
    for batch in batches:
        found = None
        for name in sorted(batch):
            value = batch[name]
            if (
                "mask" in name.lower()
                and isinstance(value, np.ndarray)
                and value.ndim == 2
                and value.dtype.kind in "iub"
            ):
                found = value != 0
                break
        masks.append(found)
    return masks


def _unpadded(
    arrays: list[np.ndarray], masks: list[np.ndarray | None] | None
) -> tuple[list[np.ndarray], int]:
    """``arrays`` without their padded rows, when every batch has a mask that matches the
    output's two leading axes (and some row is padding); else unchanged."""
    if (
        not masks
        or len(masks) != len(arrays)
        or any(
            m is None or a.ndim < 3 or a.shape[:2] != m.shape
            for a, m in zip(arrays, masks, strict=True)
        )
    ):
        return arrays, 0
    dropped = sum(int((~m).sum()) for m in masks if m is not None)
    if dropped == 0:
        return arrays, 0
    return [a[m] for a, m in zip(arrays, masks, strict=True)], dropped


def validation_session(
    model: onnx.ModelProto, fused: bool, what: str = "quantized", ours: bool = False
) -> Any:
    """An onnxruntime session for ``model``, with Q/DQ fusion (all optimizations) or none, on
    the device of :mod:`onnxq.device` (by default the CPU).

    Nodes run in the model's priority order, not onnxruntime's default order: the default
    runs every weight's DequantizeLinear first, so an unfused model would hold all its weights
    dequantized to float at once (4x the int8 model) during each run.  ``ours``: the model is
    onnxq's output, so onnxruntime refusing it is an :class:`InternalError` (else the model's
    own :class:`UnsupportedModelError`).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures reach the user as onnxq errors, not as log lines
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if fused
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    with ir.scratch_dir() as workdir:
        payload = ir.session_bytes_or_path(model, workdir)
        placed = device.configure(opts)
        try:
            session = ort.InferenceSession(payload, opts, providers=device.providers(), **placed)
        except Exception as exc:
            message = f"onnxruntime cannot load the {what} model: {one_line(exc, 400)}"
            if ours:
                raise InternalError(message, onnxruntime_failed=True) from None
            raise UnsupportedModelError(message, onnxruntime_failed=True) from None
        return device.confirm(session)


def run_outputs(
    model: onnx.ModelProto | Any,
    batches: list[Batch],
    fused: bool,
    what: str,
    ours: bool = False,
) -> list[dict[str, np.ndarray]]:
    """Run ``model`` (a proto or a ready session) on ``batches``.

    A session made here is released before this returns (the caller's next session must not
    find this one's weights still in memory).  A failure is the model's
    (:class:`UnsupportedModelError`: the batches match its declared inputs, so the model
    does not run on such data in onnxruntime), or onnxq's when ``ours`` (its own output:
    :class:`InternalError`).
    """
    if not isinstance(model, onnx.ModelProto):
        return _run_all(model, batches, what, ours)
    session = validation_session(model, fused, what, ours)
    try:
        return _run_all(session, batches, what, ours)
    finally:
        del session
        release_free_memory()  # the float model's weights, freed but kept by the C library


def _run_all(
    session: Any, batches: list[Batch], what: str, ours: bool
) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    results = []
    for i, batch in enumerate(batches):
        try:
            values = session.run(names, batch)
        except Exception as exc:
            message = f"the {what} model fails in onnxruntime on held batch {i}: {one_line(exc)}"
            if ours:
                raise InternalError(message, onnxruntime_failed=True) from None
            raise UnsupportedModelError(
                f"{message}; the batch matches the model's declared inputs, so the model itself "
                "does not run on such data in onnxruntime: check the float model on it",
                onnxruntime_failed=True,
            ) from None
        results.append(dict(zip(names, values, strict=True)))
    return results


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
    out = []
    for name in reference[0] if reference else []:
        ref = [_as_array(r[name]) for r in reference]
        got = [_as_array(q[name]) for q in quantized]
        if any(v is None for v in ref + got):
            kind = type(reference[0][name]).__name__
            out.append(
                OutputFidelity(
                    name, 0.0, 0.0, 0.0, f"{NOT_COMPARED}a {kind} output, not a numeric tensor"
                )
            )
            continue
        ref_arrays, got_arrays = cast(list[np.ndarray], ref), cast(list[np.ndarray], got)
        if not all(np.issubdtype(r.dtype, np.floating) for r in ref_arrays):
            out.append(
                OutputFidelity(name, _agreement(ref_arrays, got_arrays), 0.0, 0.0, "agreement")
            )
            continue
        class_axis = (axes or {}).get(name)
        if class_axis is None and kinds is not None:
            class_axis = score_axis(ref_arrays, name in kinds.logits)
        ref_arrays, padded = _unpadded(ref_arrays, masks)
        if padded:  # [batch, sequence, ...] became [rows, ...]
            got_arrays, _ = _unpadded(got_arrays, masks)
            if class_axis is not None and class_axis >= 0:
                class_axis = class_axis - 1 if class_axis >= 2 else None
        top1 = _top1(ref_arrays, got_arrays, class_axis)
        a, b = _flat64(ref_arrays), _flat64(got_arrays)
        nonfinite = mismatch = 0
        if a.shape != b.shape:
            out.append(
                OutputFidelity(
                    name,
                    0.0,
                    0.0,
                    0.0,
                    f"{SHAPE_CHANGED} gives {b.size} values, the float model {a.size}",
                )
            )
            continue
        finite = np.isfinite(a) & np.isfinite(b)
        if not finite.all():
            same = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
            nonfinite = int((~np.isfinite(a)).sum())
            mismatch = int((~finite & ~same).sum())
            a, b = a[finite], b[finite]
        del finite
        err, peak = _abs_max(a, b), _abs_max(a)
        cos = _cosine(a, b, overwrite=True)
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
        per_sample = (
            None if nonfinite or mismatch or padded else _sample_cosines(ref_arrays, got_arrays)
        )
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
        sliced = (
            None
            if nonfinite or mismatch or top1 is not None
            else _slice_cosines(ref_arrays, got_arrays)
        )
        if sliced is not None:
            axis, cosines, peaks = sliced
            k = int(np.argmin(cosines))
            nonzero = peaks[peaks > 0]
            ratio = float(nonzero.max() / nonzero.min()) if nonzero.size else 1.0
            result = replace(
                result,
                slice_axis=axis,
                slices=len(cosines),
                worst_slice=k,
                worst_slice_cosine=round(float(cosines[k]), 6),
                slice_peak_ratio=round(ratio, 3),
            )
        out.append(result)
    return out


def _agreement(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The share of values equal in both models (a batch whose shapes differ: none), so that
    one changed label in a batch of 32 counts 1/32, not the whole batch."""
    equal = total = 0
    for r, g in zip(ref, got, strict=True):
        if r.shape == g.shape:
            equal += int(np.count_nonzero(r == g))
            total += r.size
        else:
            total += max(r.size, g.size)
    return equal / total if total else 1.0


def _sample_cosines(ref: list[np.ndarray], got: list[np.ndarray]) -> np.ndarray | None:
    """The cosine of each sample (an item along a batch's leading axis) of an output of rank
    >= 2, or None (rank < 2, shapes that differ, one value per sample, fewer than two
    samples)."""
    if any(
        r.ndim < 2 or r.shape != g.shape or r[0].size < 2 for r, g in zip(ref, got, strict=True)
    ):
        return None
    if sum(len(r) for r in ref) < 2:
        return None
    values: list[float] = []
    for r, g in zip(ref, got, strict=True):
        rows_r, rows_g = r.reshape(len(r), -1), g.reshape(len(g), -1)
        values.extend(
            _cosine(a.astype(np.float64), b.astype(np.float64), overwrite=True)
            for a, b in zip(rows_r, rows_g, strict=True)
        )
    return np.asarray(values) if len(values) >= 2 else None


def _cosine(a: np.ndarray, b: np.ndarray, overwrite: bool = False) -> float:
    """Cosine of two finite float64 vectors; both are divided by their common peak first, so
    that values past 1e154 (whose squares overflow) give a number, not NaN.  ``overwrite``:
    divide ``a`` and ``b`` in place (the caller's copies; no temporaries)."""
    peak = max(_abs_max(a), _abs_max(b))
    if peak > 0:
        if overwrite:
            a /= peak
            b /= peak
        else:
            a, b = a / peak, b / peak
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > 0 else float(np.array_equal(a, b))


def _flat64(arrays: list[np.ndarray]) -> np.ndarray:
    """All of ``arrays`` as one flat float64 vector, built in place (one copy)."""
    out = np.empty(sum(x.size for x in arrays), np.float64)
    at = 0
    for x in arrays:
        out[at : at + x.size] = x.ravel()
        at += x.size
    return out


_ABS_CHUNK = 1 << 20  # values per slice in _abs_max (8 MB of float64)


def _abs_max(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """``max |a|`` (or ``max |a - b|``) of flat vectors, 0 when empty, taken in slices so
    that no full-size temporary is made (the maximum is exact in any order)."""
    peak = 0.0
    for at in range(0, a.size, _ABS_CHUNK):
        part = (
            a[at : at + _ABS_CHUNK]
            if b is None
            else a[at : at + _ABS_CHUNK] - b[at : at + _ABS_CHUNK]
        )
        peak = max(peak, float(np.abs(part).max(initial=0.0)))
    return peak


MAX_SLICES = 128  # a slice axis has 2..MAX_SLICES entries ...
MIN_SLICE_REPEAT = 8  # ... each repeated over at least this many values per sample
DOMINATED = 2.0  # slice peak ratio from which a low slice cosine is worth a warning


def slice_axis_of(shape: tuple[int, ...]) -> int | None:
    """The axis an output of this (per-batch) shape is compared along slice by slice: of the
    axes after the first (the batch), the smallest with 2..:data:`MAX_SLICES` entries whose
    slices hold at least :data:`MIN_SLICE_REPEAT` values per sample (the first on a tie);
    None for rank < 3 or no such axis."""
    if len(shape) < 3:
        return None
    per_sample = int(np.prod(shape[1:]))
    best = None
    for axis in range(1, len(shape)):
        k = shape[axis]
        if (
            2 <= k <= MAX_SLICES
            and per_sample >= MIN_SLICE_REPEAT * k
            and (best is None or k < shape[best])
        ):
            best = axis
    return best


def _slice_cosines(
    ref: list[np.ndarray], got: list[np.ndarray]
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(axis, cosine of every slice along it over all batches, each slice's peak |x| in the
    float model), or None when the outputs have no slice axis or their shapes disagree between
    batches or models."""
    axis = slice_axis_of(ref[0].shape)
    if axis is None:
        return None
    k = ref[0].shape[axis]
    if any(
        r.shape != g.shape or r.ndim != ref[0].ndim or r.shape[axis] != k
        for r, g in zip(ref, got, strict=True)
    ):
        return None
    # one scale for every batch (as in _cosine: squares of values past 1e154 overflow)
    scale = max((float(np.abs(x).max(initial=0.0)) for x in (*ref, *got)), default=0.0) or 1.0
    dot, na, nb, peaks = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    for r, g in zip(ref, got, strict=True):
        rm = np.moveaxis(r, axis, 0).reshape(k, -1).astype(np.float64)
        gm = np.moveaxis(g, axis, 0).reshape(k, -1).astype(np.float64)
        if rm.size:
            peaks = np.maximum(peaks, np.abs(rm).max(axis=1))
        rm, gm = rm / scale, gm / scale
        dot += np.einsum("ij,ij->i", rm, gm)
        na += np.einsum("ij,ij->i", rm, rm)
        nb += np.einsum("ij,ij->i", gm, gm)
    cosines = np.ones(k)
    denom = np.sqrt(na * nb)
    positive = denom > 0
    cosines[positive] = dot[positive] / denom[positive]
    # an all-zero slice: 1 when both models give zeros there, else 0
    cosines[~positive] = ((na == 0) & (nb == 0))[~positive].astype(np.float64)
    return axis, cosines, peaks


def _top1(ref: list[np.ndarray], got: list[np.ndarray], axis: int | None) -> float | None:
    """The share of rows along ``axis`` whose argmax agrees (None: no axis, or shapes that do
    not allow it)."""
    if axis is None:
        return None
    same: list[np.ndarray] = []
    for r, g in zip(ref, got, strict=True):
        if r.shape != g.shape or not r.ndim or not -r.ndim <= axis < r.ndim or r.size == 0:
            return None
        same.append((np.argmax(r, axis=axis) == np.argmax(g, axis=axis)).ravel())
    return round(float(np.concatenate(same).mean()), 6) if same else None


def _as_array(value: Any) -> np.ndarray | None:
    """A numeric array for an output: tensors as they are, a sequence of {key: number} maps
    (scikit-learn's ZipMap probabilities) as rows of its values in key order; None for any
    other output."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biuf" else None
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = sorted(value[0])
        try:
            return np.array([[float(v[k]) for k in keys] for v in value], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            return None
    return None
