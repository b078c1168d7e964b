"""The ceiling on the multiply-adds the ``--target`` search leaves float
(``target_max_float_macs``): the choice within it, the best model when the target is missed
within it, the report and the CLI."""

from __future__ import annotations

import json

import pytest

import onnxq
from onnxq.cli import main
from onnxq.config import QuantConfig
from onnxq.errors import ConfigError
from onnxq.mixed.float_budget import ceiling, ceiling_warning, choose_within
from tests import graphs
from tests.mixed.test_float_cost import ScoredBy, layer
from tests.mixed.test_search import conv_chain

GAINS = {"big": 0.5, "mid": 0.3, "small": 0.1}
MACS = {"big": 1000, "mid": 100, "small": 10}
RANKING = [layer(n, GAINS[n], MACS[n]) for n in GAINS]


def additive(nodes: frozenset[str]) -> float:
    return sum(GAINS[n] for n in nodes)


def placed(nodes: frozenset[str]) -> int:
    return sum(MACS[n] for n in nodes)


def names(layers) -> list[str]:
    return sorted(s.node for s in layers)


def test_ceiling_is_the_share_of_the_model_rounded_down():
    assert ceiling(0.1, 1005) == 100
    assert ceiling(None, 1005) is None and ceiling(0.1, None) is None


def test_within_the_ceiling_the_cheap_layers_that_meet_the_target_stay():
    # without a ceiling `big` alone meets 0.4; within 110 multiply-adds mid + small do
    trials = ScoredBy(0.4, additive, placed)
    kept = choose_within(trials, 0.0, RANKING, 110)  # type: ignore[arg-type]
    assert names(kept) == ["mid", "small"]
    assert all(placed(key) <= 110 for key in trials.scored)  # nothing over it was scored


def test_missed_within_the_ceiling_keeps_the_best_model_that_fits():
    trials = ScoredBy(0.9, additive, placed)
    kept = choose_within(trials, 0.0, RANKING, 110)  # type: ignore[arg-type]
    assert names(kept) == ["mid", "small"]  # 0.4: the best score within 110
    assert names(choose_within(ScoredBy(0.9, additive, placed), 0.0, RANKING, 50)) == ["small"]  # type: ignore[arg-type]


def test_a_layer_alone_that_meets_the_target_within_the_ceiling_is_found():
    # the greedy prefers `small` by gain per MAC, but only `mid` meets the target
    def score(nodes: frozenset[str]) -> float:
        return 1.0 if "mid" in nodes else 0.1 * len(nodes)

    ranking = [layer("mid", 1.0, 100), layer("small", 0.1, 1)]
    trials = ScoredBy(0.9, score, lambda nodes: sum({"mid": 100, "small": 1}[n] for n in nodes))
    kept = choose_within(trials, 0.0, ranking, 100)  # type: ignore[arg-type]
    assert names(kept) == ["mid"]


def test_nothing_fits_when_the_all_int8_placement_is_over_the_ceiling():
    trials = ScoredBy(0.4, additive, lambda nodes: 500 + placed(nodes))
    assert choose_within(trials, 0.0, RANKING, 110) == []  # type: ignore[arg-type]
    assert not trials.scored
    assert "already leaves 50.0%" in str(ceiling_warning(0.1, 1000, 500))
    assert ceiling_warning(0.6, 1000, 500) is None
    assert "ignored" in str(ceiling_warning(0.1, None, None))


@pytest.mark.parametrize("given", ["10%", "0.1", 0.1])
def test_the_share_is_a_number_or_a_percentage(given):
    assert QuantConfig(target_max_float_macs=given).accuracy.target_max_float_macs == 0.1


@pytest.mark.parametrize("given", ["ten", "150%", -0.1, True])
def test_a_bad_share_is_a_config_error(given):
    with pytest.raises(ConfigError, match="target_max_float_macs"):
        QuantConfig.from_dict({"target_max_float_macs": given})


def search_record(m, threshold, **options) -> dict:
    result = onnxq.quantize(
        m, graphs.random_batches(m, 16), progress=False, target=f"cosine={threshold}", **options
    )
    return result.report.mixed_precision


def reachable_threshold(m) -> float:
    """A cosine that keeping the most harmful layer float reaches and all INT8 does not."""
    base = search_record(m, 0.0)
    return (base["sensitivity"][0]["score_float_alone"] + base["int8_score"]) / 2


def test_run_within_a_ceiling_never_leaves_more_float_and_says_so():
    m = conv_chain()
    threshold = reachable_threshold(m)
    free = search_record(m, threshold, target_cost="macs")
    assert free["met"] and free["kept_float"]
    tight = free["model_float_macs_fraction"] / 2
    record = search_record(m, threshold, target_cost="macs", target_max_float_macs=tight)
    assert record["max_float_macs_fraction"] == tight
    assert record["model_float_macs_fraction"] <= tight
    loose = search_record(m, threshold, target_cost="macs", target_max_float_macs=1.0)
    assert loose["kept_float"] == free["kept_float"]  # a ceiling that fits changes nothing


def test_missed_within_the_ceiling_warns_with_the_ceiling():
    m = conv_chain()
    result = onnxq.quantize(
        m, graphs.random_batches(m, 16), progress=False, target="cosine=1.5",
        target_max_float_macs=0.3,
    )  # fmt: skip
    record = result.report.mixed_precision
    assert not record["met"] and record["model_float_macs_fraction"] <= 0.3
    assert any("found within the ceiling of 30.0%" in w for w in result.report.warnings)
    assert "(ceiling 30.0%)" in result.report.summary(timing=False)


def test_excluded_layers_count_against_the_ceiling():
    m = conv_chain()  # four equal convs: conv0 excluded leaves 25% float before the search
    result = onnxq.quantize(
        m, graphs.random_batches(m, 16), progress=False, target="cosine=1.5",
        target_max_float_macs=0.1, exclude=["conv0"],
    )  # fmt: skip
    record = result.report.mixed_precision
    assert record["kept_float"] == [] and record["model_float_macs_fraction"] == 0.25
    assert any("already leaves 25.0%" in w for w in result.report.warnings)


def test_cli_ceiling_missed_exits_1_and_writes_the_model(tmp_path, model_file, calib_dir, capsys):
    path, calib = model_file(conv_chain()), calib_dir(conv_chain(), n=8)
    out, report = tmp_path / "q.onnx", tmp_path / "r.json"
    code = main(["quantize", str(path), "-o", str(out), "--calib", str(calib), "-q", "--target",
                 "cosine=1.5", "--target-cost", "macs", "--target-max-float-macs", "25%",
                 "--set", "accuracy.heldout_batches=2", "--report", str(report)])  # fmt: skip
    assert code == 1 and out.exists()
    assert "raise --target-max-float-macs" in capsys.readouterr().err
    record = json.loads(report.read_text())["mixed_precision"]
    assert record["max_float_macs_fraction"] == 0.25
    assert record["model_float_macs_fraction"] <= 0.25


def test_cli_bad_share_is_a_user_error(tmp_path, model_file, calib_dir, capsys):
    path = model_file(conv_chain())
    code = main(["quantize", str(path), "-o", str(tmp_path / "q.onnx"), "--calib",
                 str(calib_dir(conv_chain())), "--target", "cosine=0.9",
                 "--target-max-float-macs", "lots"])  # fmt: skip
    assert code == 2
    assert "target_max_float_macs" in capsys.readouterr().err


def test_a_run_within_a_ceiling_is_byte_identical_when_repeated():
    m = conv_chain()
    outputs = [
        onnxq.quantize(
            m, graphs.random_batches(m, 16), progress=False, target="cosine=1.5",
            target_cost="macs", target_max_float_macs="30%", calibration_mode="prefix",
        ).model.SerializeToString()
        for _ in range(2)
    ]  # fmt: skip
    assert outputs[0] == outputs[1]
