"""Placement in tests: one pass of the rule engine over a graph, as ``onnxq explain`` runs it."""

from __future__ import annotations

import onnx

from onnxq import ir
from onnxq.backends.profile import PROFILES, BackendProfile
from onnxq.config import QuantConfig
from onnxq.place.annotations import Annotations, Excluded
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts


def annotate_graph(
    graph: ir.Graph,
    profile: BackendProfile,
    config: QuantConfig | None = None,
    excluded: Excluded | None = None,
) -> Annotations:
    """The engine's annotations of ``graph`` under ``profile`` (and ``config``)."""
    config = config or QuantConfig(backend=profile.name)
    return annotate(GraphFacts.of(graph, profile), profile, config.placement, excluded)


def annotated(model: onnx.ModelProto, backend: str = "tensorrt", **options) -> Annotations:
    """``model``'s annotations for ``backend``'s profile, with QuantConfig ``options``."""
    graph = ir.Graph(ir.infer_shapes(model))
    return annotate_graph(graph, PROFILES[backend], QuantConfig(backend=backend, **options))
