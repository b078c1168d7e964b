"""Helpers of the placement rules' tests: annotate a model, read a node's decision and the
tensors' kinds, count the Q/DQ of a quantized model.  A test module that imports
``_onnxruntime_without_cost_rules`` runs with the onnxruntime profile's cost rules off."""

from __future__ import annotations

import onnx
import pytest

import onnxq
from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.annotations import Annotations
from tests import graphs
from tests.placement import annotate_graph
from tests.profiles import no_cost_rules


@pytest.fixture(autouse=True)
def _onnxruntime_without_cost_rules():
    with no_cost_rules():
        yield


def annotated(model: onnx.ModelProto, backend: str = "tensorrt", **options) -> Annotations:
    graph = ir.Graph(ir.infer_shapes(model))
    return annotate_graph(graph, PROFILES[backend], QuantConfig(backend=backend, **options))


def decision(ann: Annotations, node: str):
    (found,) = [d for d in ann.decisions if d.node == node]
    return found


def kinds(ann: Annotations) -> dict[str, tuple[str, int | None]]:
    return {t.tensor: (t.kind, t.axis) for t in ann.tensors.values()}


def qdq_counts(model: onnx.ModelProto, backend: str) -> tuple[int, int]:
    result = onnxq.quantize(model, graphs.random_batches(model, 3), backend=backend, progress=False)
    out = result.model
    return graphs.count_ops(out, "QuantizeLinear"), graphs.count_ops(out, "DequantizeLinear")
