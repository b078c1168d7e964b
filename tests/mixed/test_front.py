"""The first half of a run: profile, prepare, held-out batches, float rewrites, graph facts."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq import ir
from onnxq.config import QuantConfig
from onnxq.errors import ConfigError
from onnxq.mixed.front import float_graph
from tests import graphs


def test_the_float_rewrites_run_on_the_prepared_model_and_the_facts_see_them():
    m = graphs.residual_add()
    plain = float_graph(m, QuantConfig(cle=False))
    cle = float_graph(m, QuantConfig(cle=True))
    assert "cle" in cle.steps.recovery.sections and "cle" not in plain.steps.recovery.sections
    assert cle.facts.graph.model is cle.prepared.model  # facts of the rewritten model
    assert plain.data is None and plain.heldout is None and plain.profile.name == "tensorrt"


def test_the_target_batches_are_held_out_before_the_rewrites_read_the_data():
    m = graphs.matmul_const(k=64, n=32)
    batches = graphs.random_batches(m, 8)
    front = float_graph(m, QuantConfig(heldout_batches=2), batches, hold=True)
    assert front.heldout is not None and len(front.heldout.batches) == 2
    rest = list(front.data or [])
    assert len(rest) == 6 and np.array_equal(rest[0]["x"], batches[2]["x"])
    assert "smoothquant" in front.steps.recovery.sections  # on by default, on the rest


def test_a_cached_run_skips_the_rewrites_and_says_so():
    front = float_graph(graphs.residual_add(), QuantConfig(cle=True), cached=True)
    assert "cle" not in front.steps.recovery.sections
    assert any(w.startswith("cle skipped") for w in front.steps.recovery.warnings)


def test_a_profile_refusal_comes_before_the_model_is_read():
    with pytest.raises(ConfigError, match="precision int16 with --backend tensorrt"):
        float_graph("missing.onnx", QuantConfig(precision="int16"))


def test_the_guard_wraps_the_steps_after_prepare():
    seen = []

    class Guard:
        def __init__(self, upgrade: ir.OpsetUpgrade | None) -> None:
            seen.append(upgrade)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    # an opset-17 model: tensorrt's FP16 compute converts it to 19 (FP16 Q/DQ scales), and
    # the guard is told; an FP32 run needs no more than 13 and converts nothing
    float_graph(graphs.conv_relu(), QuantConfig(), guard=Guard)
    float_graph(graphs.conv_relu(), QuantConfig(high_precision="fp32"), guard=Guard)
    assert seen == [ir.OpsetUpgrade(17, 19), None]
