"""Accuracy targets: parsing, and the built-in metrics against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxq.errors import ConfigError
from onnxq.numerics.accuracy_target import METRICS, AccuracyTarget, parse_target


def outputs(seed: int = 0, noise: float = 0.0) -> tuple[list[dict], list[dict]]:
    r = np.random.default_rng(seed)
    ref = [{"logits": r.standard_normal((2, 10)).astype(np.float32)} for _ in range(3)]
    got = [
        {"logits": (b["logits"] + noise * r.standard_normal((2, 10))).astype(np.float32)}
        for b in ref
    ]
    return ref, got


def test_parse_target():
    t = parse_target("cosine=0.999")
    assert t.metric == "cosine" and t.threshold == 0.999 and t.describe() == "cosine >= 0.999"
    assert parse_target("sqnr=30").met(30.0) and not parse_target("sqnr=30").met(29.9)


@pytest.mark.parametrize("text", ["cosine", "cosine=", "=0.9", "cosine=abc", "cosine=nan"])
def test_malformed_target_says_the_form(text):
    with pytest.raises(ConfigError, match="expected METRIC=VALUE"):
        parse_target(text)


def test_unknown_metric_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="valid: cosine, sample_cosine, sqnr, top1"):
        parse_target("psnr=20")


def test_cosine_and_sqnr_match_numpy():
    ref, got = outputs(noise=0.1)
    a = np.concatenate([b["logits"].ravel() for b in ref]).astype(np.float64)
    b = np.concatenate([b["logits"].ravel() for b in got]).astype(np.float64)
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert METRICS["cosine"](ref, got) == pytest.approx(cos, abs=1e-12)
    snr = 10 * math.log10(float(a @ a) / float((a - b) @ (a - b)))
    assert METRICS["sqnr"](ref, got) == pytest.approx(snr, abs=1e-9)


def test_sample_cosine_is_the_worst_sample():
    ref, got = outputs(noise=0.01)
    got[1]["logits"][0] = -ref[1]["logits"][0]  # one sample flipped
    assert METRICS["sample_cosine"](ref, got) == pytest.approx(-1.0, abs=1e-6)
    assert METRICS["cosine"](ref, got) > 0


def test_top1_agreement_counts_rows():
    ref, got = outputs()
    got[0]["logits"][1] = -ref[0]["logits"][1]  # one row of six changes its argmax
    assert METRICS["top1"](ref, got) == pytest.approx(5 / 6)


def test_top1_without_class_scores_is_a_config_error():
    ref = [{"score": np.ones((4,), np.float32)}]
    with pytest.raises(ConfigError, match="no output of the model holds class scores"):
        METRICS["top1"](ref, ref)


def test_equal_outputs_score_perfectly():
    ref, _ = outputs()
    assert METRICS["cosine"](ref, ref) == pytest.approx(1.0)
    assert METRICS["sqnr"](ref, ref) == math.inf
    assert METRICS["top1"](ref, ref) == 1.0


def test_callable_target_is_named_after_the_function():
    def psnr(reference, quantized):
        return 40.0

    t = AccuracyTarget(psnr, 35)
    assert t.describe() == "psnr >= 35" and t.evaluate([], []) == 40.0


def test_target_rejects_a_non_number_threshold():
    with pytest.raises(ConfigError, match="threshold must be a number"):
        AccuracyTarget("cosine", "high")  # type: ignore[arg-type]


def test_builtin_metrics_leave_padded_rows_out():
    r = np.random.default_rng(0)
    ref = [{"hidden": r.standard_normal((1, 4, 8)).astype(np.float32)}]
    got = [{"hidden": ref[0]["hidden"].copy()}]
    got[0]["hidden"][0, 3] = 100.0  # a padded token: the float model's value there is noise
    mask = np.array([[True, True, True, False]])
    target = parse_target("cosine=0.999")
    assert target.evaluate(ref, got) < 0.9
    assert target.evaluate(ref, got, [mask]) == pytest.approx(1.0)
    seen = []
    raw = AccuracyTarget(lambda a, b: seen.append(b[0]["hidden"].shape) or 1.0, 0.5, name="raw")
    raw.evaluate(ref, got, [mask])
    assert seen == [(1, 4, 8)]  # a callable gets the outputs as the models gave them
