"""AdaRound's float-mode weights learned once and used by the ``--target`` search's trials."""

from __future__ import annotations

import dataclasses

import pytest

import onnxq
import onnxq.recover.rounders as rounders
from onnxq.backends.runs import run_outputs
from onnxq.numerics.accuracy_target import AccuracyTarget, parse_target
from onnxq.recover.trial_weights import trial_weights
from tests import graphs
from tests.mixed.test_search import conv_chain, dequantized_inputs


def run(model, target, **options):
    held = graphs.random_batches(model, 3, seed=7)
    return onnxq.quantize(
        model,
        graphs.random_batches(model, 16),
        progress=False,
        target=dataclasses.replace(parse_target(target), heldout=held),
        **options,
    ), held


def counted_adaround(monkeypatch) -> list[int]:
    """Count the calls of float-mode AdaRound."""
    calls: list[int] = []
    real = rounders.adaround

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounders, "adaround", counting)
    return calls


def test_trials_score_the_weights_the_run_writes(monkeypatch):
    calls = counted_adaround(monkeypatch)
    m = conv_chain()
    # high_precision fp32: the search's trials are FP32 Q/DQ graphs; so is the model written
    # here, so that the trial is exactly the written model (the score of an FP16 one:
    # tests/mixed/test_search.py::test_score_is_the_written_models_recovery_included)
    fp32 = {"high_precision": "fp32"}
    result, held = run(m, "cosine=0.0", adaround=True, adaround_steps=50, **fp32)
    record = result.report.mixed_precision
    assert len(calls) == 1  # learned once, before the search; reused for the model written
    assert record["kept_float"] == []
    # the all-INT8 trial materialized AdaRound's integers: it is the model written
    assert record["search_score"] == record["score"]
    reference = run_outputs(m, held, False, "float")
    written = run_outputs(result.model, held, False, "quantized", ours=True)
    expected = AccuracyTarget("cosine", 0.0).evaluate(reference, written)
    assert record["score"] == pytest.approx(expected, abs=1e-6)
    plain, _ = run(m, "cosine=0.0", **fp32)
    assert plain.report.mixed_precision["search_score"] != record["search_score"]
    learned = result.report.recovery["adaround"]["layers"]
    assert [layer["node"] for layer in learned] == ["conv0", "conv1", "conv2", "conv3"]


def test_written_model_learns_nothing_for_layers_kept_float(monkeypatch):
    calls = counted_adaround(monkeypatch)
    m = conv_chain()
    base, _ = run(m, "cosine=0.0", adaround=True, adaround_steps=50)
    ranking = base.report.mixed_precision["sensitivity"]
    assert ranking[0]["node"] == "conv2"
    threshold = (ranking[0]["score_float_alone"] + base.report.mixed_precision["int8_score"]) / 2
    result, _ = run(m, f"cosine={threshold}", adaround=True, adaround_steps=50)
    record = result.report.mixed_precision
    assert [k["node"] for k in record["kept_float"]] == ["conv2"]
    assert "conv2" not in dequantized_inputs(result.model)
    section = result.report.recovery["adaround"]
    assert [layer["node"] for layer in section["layers"]] == ["conv0", "conv1", "conv3"]
    assert section["learned"] == sum(layer["kept"] == "learned" for layer in section["layers"])
    assert len(calls) == 2  # once per run


def test_placement_dependent_modes_are_not_learned_before_the_search():
    m = conv_chain()

    class Options:
        adaround = True
        adaround_mode = "sequential"

    class Steps:
        options = Options()

    assert trial_weights(Steps(), m, None) is None  # type: ignore[arg-type]
    Options.adaround_mode = "block"
    assert trial_weights(Steps(), m, None) is None  # type: ignore[arg-type]
    Options.adaround, Options.adaround_mode = False, "float"
    assert trial_weights(Steps(), m, None) is None  # type: ignore[arg-type]


def test_sequential_mode_keeps_round_to_nearest_trials():
    m = conv_chain()
    plain, _ = run(m, "cosine=0.0")
    result, _ = run(m, "cosine=0.0", adaround=True, adaround_mode="sequential", adaround_steps=50)
    record = result.report.mixed_precision
    assert record["search_score"] == plain.report.mixed_precision["search_score"]
    assert result.report.recovery["adaround"]["mode"] == "sequential"
