"""AdaRound's weights in the ``--target`` search's trials, learned once.

The search (:mod:`onnxq.mixed.search`) scores placements with round-to-nearest weights
unless it is given weights chosen before; the run then writes the chosen placement with
AdaRound's.  A set of float layers that meets the target only with AdaRound's weights, or
one whose layers were float only to avoid a weight error that AdaRound removes, is then
found only by chance.

AdaRound's ``float`` mode (the default ``adaround_mode``) learns each layer's rounding from
the *float* model's inputs to that layer: a layer's integers do not depend on which other
layers are quantized.  So they are learned once, for every layer the all-INT8 placement
quantizes, before the search (:func:`trial_weights`); every trial materializes with them, and
the run writes the chosen placement with the same integers, restricted to the weights it
still quantizes (:func:`written_weights`): AdaRound runs once, as without a target.  The
``sequential`` and ``block`` modes learn from inputs that depend on the placement; they run
once, on the chosen placement, as before.
"""

from __future__ import annotations

from typing import Any

import onnx

from onnxq.numerics.qparams import QParams
from onnxq.place.annotations import Annotations
from onnxq.recover.adaround import ChosenWeight
from onnxq.recover.stages import Steps, choose_weights


def trial_weights(
    steps: Steps, model: onnx.ModelProto, annotations: Annotations
) -> dict[str, ChosenWeight] | None:
    """AdaRound's weights (by weight tensor) for every weight ``annotations`` (the all-INT8
    placement) quantizes, when the run learns them in ``float`` mode; None: it does not
    (AdaRound off, or a mode whose rounding depends on the placement)."""
    options = steps.options
    if not options.adaround or options.adaround_mode != "float":
        return None
    return choose_weights(steps, model, annotations, {})


def written_weights(
    steps: Steps,
    model: onnx.ModelProto,
    annotations: Annotations,
    qparams: dict[str, QParams],
    learned: dict[str, ChosenWeight] | None,
) -> dict[str, ChosenWeight]:
    """The weights the run writes ``annotations`` with: ``learned`` (:func:`trial_weights`'s)
    restricted to the weights it quantizes, and the report's AdaRound section restricted to
    their layers; when nothing was learned before (None), :func:`choose_weights`'s."""
    if learned is None:
        return choose_weights(steps, model, annotations, qparams)
    quantized = {ann.tensor for ann in annotations.of_kind("weight")}
    section = steps.recovery.sections.get("adaround")
    if isinstance(section, dict) and isinstance(section.get("layers"), list):
        layers: list[dict[str, Any]] = [
            layer for layer in section["layers"] if layer.get("weight") in quantized
        ]
        section["layers"] = layers
        section["learned"] = sum(layer.get("kept") == "learned" for layer in layers)
    return {weight: chosen for weight, chosen in learned.items() if weight in quantized}


__all__ = ["trial_weights", "written_weights"]
