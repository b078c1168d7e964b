"""Recovery as the run calls it: the float rewrites before calibration, the rest after."""

from __future__ import annotations

from onnxq.calibrate.measure import statistics_source
from onnxq.calibrate.ranges import activation_ranges
from onnxq.config import QuantConfig
from onnxq.mixed.front import float_graph
from onnxq.place.loop import place
from onnxq.recover.pipeline import after_calibration
from onnxq.recover.stages import measured_qparams
from tests import graphs


def _placed(cfg: QuantConfig, n: int = 4):
    m = graphs.conv_bn_relu()
    front = float_graph(m, cfg, graphs.random_batches(m, n))
    measure = statistics_source(
        front.prepared.model, front.facts, front.profile, front.data, front.inputs,
        cfg.calibration, False, None,
    )  # fmt: skip
    return front, place(front.facts, front.profile, cfg.placement, measure)


def test_with_nothing_asked_the_ranges_are_the_measured_ones():
    cfg = QuantConfig()
    front, placement = _placed(cfg)
    done = after_calibration(
        front.steps, front.prepared.model, placement.annotations, placement.statistics
    )
    expected = activation_ranges(
        placement.annotations, placement.statistics.stats, front.profile, cfg.percentile
    )
    assert done.ranges == expected and done.statistics is placement.statistics
    assert done.ranges.qparams == measured_qparams(
        front.steps, placement.annotations, placement.statistics
    )
    assert done.chosen == {} and done.bias is None
    assert set(front.steps.recovery.sections) <= {"smoothquant"}


def test_prefix_ranges_adaround_and_bias_correction_run_after_calibration():
    cfg = QuantConfig(calibration_mode="prefix", adaround=True, adaround_steps=5)
    cfg = cfg.replace(bias_correction=True)
    front, placement = _placed(cfg)
    done = after_calibration(
        front.steps, front.prepared.model, placement.annotations, placement.statistics
    )
    sections = front.steps.recovery.sections
    assert {"calibration", "adaround"} <= set(sections)
    assert done.statistics is not placement.statistics  # measured again on the prefix
    assert set(done.chosen) == {a.tensor for a in placement.annotations.of_kind("weight")}
    assert done.bias is not None
