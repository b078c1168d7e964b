"""Outlier channels of a gated product, found from the gate and up weights."""

from __future__ import annotations

import numpy as np

from onnxq import ir
from onnxq.place.rules.gated import OutlierSplit, linear_factor, outlier_channels
from tests import graphs

SPLIT = OutlierSplit(ratio=2.0, most=16)


def down_of(model):
    graph = ir.Graph(model)
    return graph, graph.node_by_name("down")


def test_the_loud_gate_and_up_columns_are_the_outlier_channels():
    graph, down = down_of(graphs.swiglu(outliers=(3, 17, 200)))
    np.testing.assert_array_equal(outlier_channels(graph, down, SPLIT), [3, 17, 200])


def test_at_most_the_loudest_channels_and_none_in_a_plain_block():
    graph, down = down_of(graphs.swiglu(outliers=(3, 17, 200)))
    assert len(outlier_channels(graph, down, OutlierSplit(ratio=2.0, most=2))) == 2
    graph, down = down_of(graphs.swiglu())
    assert outlier_channels(graph, down, SPLIT).size == 0


def test_the_rms_norm_gain_weighs_the_columns():
    model = graphs.swiglu(gain=True)
    gain = next(t for t in model.graph.initializer if t.name == "gain")
    value = np.ones(128, np.float32)
    value[5] = 40.0  # one loud input row: the columns that read it most stand out
    gain.CopyFrom(graphs.init("gain", value))
    wg = next(t for t in model.graph.initializer if t.name == "wg")
    w = graphs.weight(graphs.rng(1), 128, 256)
    w[5, 9] = 2.0
    wg.CopyFrom(graphs.init("wg", w))
    wu = next(t for t in model.graph.initializer if t.name == "wu")
    w = graphs.weight(graphs.rng(2), 128, 256)
    w[5, 9] = 2.0
    wu.CopyFrom(graphs.init("wu", w))
    graph, down = down_of(model)
    assert 9 in outlier_channels(graph, down, SPLIT)


def test_a_product_not_made_by_two_matmuls_has_no_channels():
    graph, down = down_of(graphs.swiglu(gate_op="Add"))
    assert outlier_channels(graph, down, SPLIT) is None


def test_the_up_projection_is_the_linear_factor_unless_something_else_reads_it():
    graph, down = down_of(graphs.swiglu())
    factor = linear_factor(graph, down)
    assert factor is not None and factor.name == "up"
    graph, down = down_of(graphs.swiglu(up_read_twice=True))
    assert linear_factor(graph, down) is None
