"""Hints the report gives where a run's own choices may be what cost accuracy or did nothing:
a score-map model whose activations 'auto' calibrated with the head method and that lost
fidelity, and recovery steps that found no layer because the quantized ops sit inside
control-flow bodies."""

from __future__ import annotations

import onnx

from onnxq.place.annotations import Annotations
from onnxq.recover.bias_correction import BiasCorrectionPass
from onnxq.recover.stages import Recovery
from onnxq.report.fidelity import LOW_FIDELITY
from onnxq.validate.verify import Verification

# recovery steps that work on top-level layers: report section -> (flag, its layer count)
RECOVERY_LAYERS = {
    "cle": ("--cle", lambda x: len(x["pairs"])),
    "adaround": ("--adaround", lambda x: len(x.get("blocks", x.get("layers", [])))),
    "sequential_correction": ("--sequential-correction", lambda x: len(x["layers"])),
}


def recovery_out_of_reach(
    recovery: Recovery | None,
    bias: BiasCorrectionPass | None,
    annotations: Annotations,
    model: onnx.ModelProto,
) -> list[str]:
    """Why the recovery steps that were asked for found no layer: every quantized weighted op
    of ``model`` (as placed) sits inside If/Loop/Scan bodies (silero VAD's LSTM and convs),
    which they do not reach."""
    top = {n.name for n in model.graph.node}
    consumers = {c for w in annotations.of_kind("weight") for c, _ in w.consumers}
    inner = sorted(consumers - top)
    sections = recovery.sections if recovery is not None else {}
    empty = [
        flag
        for key, (flag, count) in RECOVERY_LAYERS.items()
        if key in sections and count(sections[key]) == 0
    ]
    if bias is not None and bias.skipped is None and not bias.corrections:
        empty.append("--bias-correction")
    if not inner or consumers & top or not empty:
        return []
    return [
        f"{', '.join(empty)} found no layer to work on: the {len(inner)} quantized weighted "
        f"op(s) of this model (e.g. {inner[0]!r}) sit inside If/Loop/Scan bodies, which the "
        "recovery steps do not reach"
    ]


def score_map_hint(method: str, annotations: Annotations, verification: Verification) -> list[str]:
    """What to try when a score-map model, whose activations 'auto' calibrated with the
    profile's head method, lost fidelity: that choice keeps the peaks of the zoo's detectors'
    scores (PP-OCRv4 det, YOLOv8n), but on others (PP-OCRv3 det: map cosine 0.870 against
    0.985 with ``mse``; a YOLOX: 0.986 against 0.997) it is the clipping methods that win."""
    chosen = annotations.score_map_method
    low = [
        out.name
        for out in verification.fidelity
        if out.compared == "cosine" and out.cosine < LOW_FIDELITY
    ]
    if method != "auto" or chosen is None or not low:
        return []
    return [
        f"'auto' calibrated this model's activations with {chosen} (its outputs are "
        f"per-element sigmoid scores, whose peaks {chosen} keeps); where output {low[0]!r} "
        "loses more than clipping would, --method mse or --range-search can recover it: "
        "compare on your metric"
    ]


__all__ = ["recovery_out_of_reach", "score_map_hint"]
