"""Quantized-prefix calibration: every activation's statistics come from the model with Q/DQ
placed before it, streamed under the memory budget like the float calibration."""

from __future__ import annotations

import numpy as np
import onnx

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.calibrate.engine import calibrate
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.materialize.qdq import materialize
from onnxq.recover.prefix import prefix_calibrate
from tests.recover.builders import conv_chain, image_batches, placed, ranges_of


def setup(cfg: QuantConfig):
    m = ir.infer_shapes(conv_chain())
    graph = ir.Graph(m)
    inputs = model_inputs(graph)
    profile = PROFILES[cfg.backend]
    batches = image_batches(m, n=6)
    annotations, result = placed(m, profile, cfg, batches, inputs)
    qparams = ranges_of(cfg, annotations)(result)
    return m, inputs, profile, batches, annotations, result, qparams


def test_statistics_are_those_of_the_quantized_model():
    cfg = QuantConfig(progress=False)
    m, inputs, profile, batches, annotations, result, qparams = setup(cfg)
    again = prefix_calibrate(
        m, annotations, qparams, result, profile, cfg.calibration, cfg.weights, batches, inputs,
        ranges_of(cfg, annotations),
    )  # fmt: skip
    acts = [a.tensor for a in annotations.of_kind("activation")]
    # nothing is quantized before the first one (conv1, 8 input channels, stays float)
    assert again.stats[acts[0]].max == result.stats[acts[0]].max
    quantized = onnx.ModelProto()
    quantized.CopyFrom(m)
    materialize(quantized, annotations, qparams, profile, cfg.weights)
    wanted = {t: again.stats[t].histogram for t in acts}
    direct = calibrate(quantized, wanted, batches, inputs, progress=False, optimize=False)
    changed = 0
    for t in acts[1:]:
        assert again.stats[t].max == direct.stats[t].max
        np.testing.assert_array_equal(again.stats[t].counts, direct.stats[t].counts)
        changed += again.stats[t].max != result.stats[t].max
    assert changed  # the upstream quantizers moved the later tensors' values
    assert again.held == result.held and again.batches_seen == result.batches_seen


def test_a_small_memory_budget_still_streams():
    cfg = QuantConfig(progress=False, memory_budget_mb=1)
    m, inputs, profile, batches, annotations, result, qparams = setup(cfg)
    runs = []
    for budget in (1, 4096):
        c = cfg.replace(memory_budget_mb=budget)
        args = (m, annotations, qparams, result, profile, c.calibration, c.weights)
        args += (batches, inputs, ranges_of(c, annotations))
        runs.append(prefix_calibrate(*args))
    for t, s in runs[1].stats.items():
        assert runs[0].stats[t].max == s.max


def test_a_one_shot_source_skips_with_a_warning():
    m = conv_chain()
    result = onnxq.quantize(m, iter(image_batches(m)), calibration_mode="prefix", progress=False)
    assert any("prefix calibration skipped" in w for w in result.report.warnings)


def test_prefix_mode_in_the_pipeline_passes_check_on_both_backends():
    m = conv_chain()
    for backend in ("tensorrt", "onnxruntime"):
        result = onnxq.quantize(
            m, image_batches(m), backend=backend, calibration_mode="prefix", progress=False
        )
        assert result.report.to_dict()["recovery"]["calibration"]["mode"] == "prefix"
        assert check(result.model, PROFILES[backend]) == []
