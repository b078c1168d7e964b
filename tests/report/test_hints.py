"""The report's hints about a run's own choices (onnxq.report.hints)."""

from __future__ import annotations

import pytest

import onnxq
from onnxq.backends.validate import OutputFidelity
from onnxq.place.annotations import Annotations
from onnxq.report.hints import score_map_hint
from onnxq.validate.verify import Verification
from tests import control_flow_graphs as cf
from tests import graphs


def test_a_score_map_model_that_lost_fidelity_under_auto_is_pointed_at_clipping_methods():
    def fidelity(cosine: float) -> Verification:
        return Verification("unfused", [OutputFidelity("prob", cosine, 1.0, 1.0)])

    scores = Annotations({}, [], score_map_method="minmax")
    (hint,) = score_map_hint("auto", scores, fidelity(0.870))  # PP-OCRv3 det's text map
    assert hint.startswith("'auto' calibrated this model's activations with minmax")
    assert "output 'prob'" in hint and "--method mse or --range-search" in hint
    assert score_map_hint("auto", scores, fidelity(0.99)) == []  # it did not lose
    assert score_map_hint("minmax", scores, fidelity(0.870)) == []  # the user chose it
    assert score_map_hint("auto", Annotations({}, []), fidelity(0.870)) == []  # no score map


@pytest.mark.parametrize(
    "flags",
    [{"adaround": True}, {"cle": True, "sequential_correction": True}, {"bias_correction": True}],
)
def test_a_recovery_step_that_cannot_reach_control_flow_bodies_says_so(flags):
    model = cf.if_convs()  # both branches' Convs are quantized, inside the If
    batches = cf.batches(model, 4, use_then=lambda k: k % 2 == 0)
    result = onnxq.quantize(model, batches, progress=False, adaround_steps=20, **flags)
    (warning,) = [w for w in result.report.warnings if "found no layer to work on" in w]
    asked = {
        "adaround": "--adaround",
        "cle": "--cle",
        "sequential_correction": "--sequential-correction",
        "bias_correction": "--bias-correction",
    }
    assert warning.startswith(", ".join(asked[k] for k in asked if k in flags))
    assert "2 quantized weighted op(s)" in warning and "If/Loop/Scan bodies" in warning
    plain = onnxq.quantize(
        graphs.conv_relu(), graphs.random_batches(graphs.conv_relu()), progress=False, **flags
    )
    assert not any("found no layer to work on" in w for w in plain.report.warnings)
