"""The first half of a run, the same for every command that looks at a model as quantize sees it:
the backend profile, ``prepare``, the calibration data (the ``--target`` batches held out of it),
the exact float rewrites, and the graph facts.

``onnxq quantize`` (:func:`onnxq.api.quantize`) continues from it to placement and
calibration; ``onnxq explain`` places the facts without data; ``onnxq analyze --sensitivity``
(:func:`onnxq.mixed.search.sensitivity_ranking`) and the ``--target`` trials rank and score
layers of the same graph.  It sits in the mixed-precision band because holding out the
target's batches (:func:`onnxq.mixed.heldout.hold_out`) comes before the float rewrites read
the data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.recipes import ActivationRecipe
from onnxq.data.inputs import Batch, InputSpec
from onnxq.data.sources import model_inputs, open_source
from onnxq.mixed.heldout import HeldOut, hold_out
from onnxq.place.facts import GraphFacts
from onnxq.prepare.stage import ModelLike, Prepared, prepare
from onnxq.recover.pipeline import before_calibration
from onnxq.recover.stages import Recovery, Steps
from onnxq.runtime.device import SessionSettings, check_device, using

# what wraps the steps after ``prepare`` (the pipeline's: a note on an onnxruntime failure of a
# model whose opset onnxq converted, onnxq.report.messages.blame_conversion)
Guard = Callable[[ir.OpsetUpgrade | None], AbstractContextManager[Any]]


@dataclass
class FloatGraph:
    """The prepared float model after the float rewrites (``prepared.model``), and what the
    rest of the run reads with it: the profile (and its note on the weight range), the model's
    inputs, the calibration data left after the held-out batches, those batches (None: no
    target), the recovery steps' inputs and record (``steps``), the graph and its facts."""

    profile: BackendProfile
    profile_note: str
    prepared: Prepared
    inputs: list[InputSpec]
    data: Iterable[Batch] | None
    heldout: HeldOut | None
    steps: Steps
    graph: ir.Graph
    facts: GraphFacts


def float_graph(
    model: ModelLike,
    cfg: ActivationRecipe,
    calibration: Any = None,
    *,
    hold: bool = False,
    heldout: Any = None,
    cached: bool = False,
    guard: Guard | None = None,
) -> FloatGraph:
    """The first half of a run of ``model`` with ``cfg`` (see the module): ``calibration``
    (any calibration source; None: no data, and the rewrites that need it are skipped with a
    warning), ``hold``: hold out the accuracy target's batches (``heldout``: from that source,
    else the first of ``calibration``); ``cached``: the run saves or loads a calibration cache
    (the float rewrites are skipped); ``guard``: what wraps the steps after ``prepare``."""
    profile, profile_note = cfg.backend_profile()  # or a refusal: nothing loaded yet
    check_device(cfg.run.device)
    prepared = prepare(model, profile, cfg.run.simplify)
    wrap = guard if guard is not None else (lambda _: contextlib.nullcontext())
    with wrap(prepared.load.opset_upgrade), using(SessionSettings(cfg.run.device)):
        inputs = model_inputs(ir.Graph(prepared.model))
        batch_size, preprocess = cfg.calibration.batch_size, cfg.calibration.preprocess
        data = None
        if calibration is not None:
            data = open_source(calibration, inputs, batch_size, preprocess)
        kept_out = None
        if hold:
            kept_out, data = hold_out(
                data, heldout, inputs, cfg.accuracy.heldout_batches, batch_size, preprocess
            )
        steps = Steps(
            profile, cfg.recovery, cfg.calibration, cfg.weights, data, inputs, Recovery(),
            cfg.recovery.bias_correction,
        )  # fmt: skip
        prepared.model = before_calibration(steps, prepared.model, cfg.placement, cached)
        graph = ir.Graph(prepared.model)
        facts = GraphFacts.of(graph, profile)
    return FloatGraph(profile, profile_note, prepared, inputs, data, kept_out, steps, graph, facts)


__all__ = ["FloatGraph", "Guard", "float_graph"]
