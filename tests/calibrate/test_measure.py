"""Where the placement loop gets its statistics (``onnxq.calibrate.measure.statistics_source``)."""

from __future__ import annotations

import pytest

from onnxq import ir
from onnxq.calibrate.measure import (
    CachedStatistics,
    Calibration,
    RuntimeQuantization,
    statistics_source,
)
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.errors import InternalError
from onnxq.place.facts import GraphFacts
from tests import graphs


def source(config: QuantConfig, data, cache=None):
    model = ir.infer_shapes(graphs.matmul_stack())
    profile = config.backend_profile()[0]
    facts = GraphFacts.of(ir.Graph(model), profile)
    inputs = model_inputs(ir.Graph(model))
    return statistics_source(model, facts, profile, data, inputs, config.calibration, False, cache)


def test_a_dynamic_profile_measures_nothing_and_holds_the_data_for_fidelity():
    m = graphs.matmul_stack()
    config = QuantConfig(backend="onnxruntime", dynamic=True, fidelity_batches=2)
    measure = source(config, graphs.random_batches(m, 5))
    assert isinstance(measure, RuntimeQuantization)
    result = measure({})
    assert result.stats == {} and result.batches_seen == 0 and len(result.held) == 2
    assert source(config, None)({}).held == []


def test_a_dynamic_placement_that_asks_for_statistics_is_a_bug():
    measure = source(QuantConfig(backend="onnxruntime", dynamic=True), None)
    with pytest.raises(InternalError, match="run time"):
        measure({"x": False})


def test_static_runs_calibrate_on_data_or_read_the_cache(tmp_path):
    m = graphs.matmul_stack()
    assert isinstance(source(QuantConfig(), graphs.random_batches(m, 2)), Calibration)
    cache = tmp_path / "c.json"
    assert isinstance(source(QuantConfig(), None, cache), CachedStatistics)
