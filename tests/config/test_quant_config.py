"""QuantConfig: validation, dict/YAML (de)serialisation, per-node queries."""

from __future__ import annotations

import pytest

from onnxq.config import BACKENDS, Override, QuantConfig
from onnxq.errors import ConfigError
from onnxq.numerics.observers import METHODS

FULL = QuantConfig(
    backend="onnxruntime",
    method="entropy",
    percentile=99.9,
    exclude=("head/*", "*Softmax*"),
    overrides=(
        Override(op_type="MatMul", exclude=True),
        Override(node="conv1", method="mse"),
        Override(tensor="skip*", method="minmax"),
    ),
    max_batches=10,
    fidelity_batches=2,
    weight_storage="qdq",
    min_channels=0,
    simplify=False,
    progress=False,
)


def test_defaults():
    cfg = QuantConfig()
    assert (cfg.backend, cfg.method, cfg.percentile) == ("tensorrt", "auto", 99.99)
    assert cfg.weight_method == "mse"
    assert cfg.exclude == () and cfg.overrides == () and cfg.min_channels is None
    assert BACKENDS == ("tensorrt", "onnxruntime")


def test_yaml_round_trip_is_equal(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(FULL.to_yaml(), encoding="utf-8")
    assert QuantConfig.from_yaml(path) == FULL
    path.write_text(QuantConfig().to_yaml(), encoding="utf-8")
    assert QuantConfig.from_yaml(path) == QuantConfig()


def test_dict_round_trip_and_lists_become_tuples():
    data = FULL.to_dict()
    assert data["exclude"] == ["head/*", "*Softmax*"]
    assert data["overrides"][0] == {"op_type": "MatMul", "exclude": True}
    again = QuantConfig.from_dict(data)
    assert again == FULL and isinstance(again.exclude, tuple)
    hash(again)  # frozen and hashable


def test_from_dict_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match="unknown key 'methd'") as info:
        QuantConfig.from_dict({"methd": "minmax"}, where="cfg.yaml")
    assert str(info.value).startswith("cfg.yaml: ")
    assert "valid keys: " in str(info.value) and " backend, " in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("percentile", "high"),
        ("max_batches", 2.5),
        ("max_batches", True),
        ("simplify", "yes"),
        ("exclude", "conv*"),
        ("fidelity_batches", None),
        ("overrides", {"node": "x"}),
    ],
)
def test_from_dict_wrong_type_names_the_key(key, value):
    with pytest.raises(ConfigError, match=f"config: {key}: expected"):
        QuantConfig.from_dict({key: value})


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([{"nod": "x"}], r"overrides\[0\]: unknown key 'nod'"),
        (["conv"], r"overrides\[0\]: expected a mapping"),
        ([{"node": 3}], r"overrides\[0\]\.node: expected a string"),
        ([{"node": "a", "exclude": "yes"}], r"overrides\[0\]\.exclude: expected true or false"),
        ([{"method": "mse"}], "needs at least one of 'node', 'op_type' or 'tensor'"),
        ([{"node": "a", "method": "median"}], "unknown calibration method 'median'"),
    ],
)
def test_from_dict_bad_overrides(overrides, match):
    with pytest.raises(ConfigError, match=match):
        QuantConfig.from_dict({"overrides": overrides})


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("backend", "tflite", "unknown backend 'tflite'; valid: tensorrt, onnxruntime"),
        ("method", "median", "unknown calibration method 'median'; valid: .*entropy, minmax, mse"),
        ("percentile", 0.0, r"percentile: must be in \(0, 100\]"),
        ("percentile", 100.5, r"percentile: must be in \(0, 100\]"),
        ("weight_storage", "fp8", "weight_storage: unknown weight storage 'fp8'; valid: int8, qdq"),
        ("max_batches", 0, "max_batches: must be >= 1"),
        ("fidelity_batches", -1, "fidelity_batches: must be >= 0"),
        ("min_channels", -2, "min_channels: must be >= 0"),
        ("histogram_sample", -1, "histogram_sample: must be >= 0"),
        ("histogram_budget", -1, "histogram_budget: must be >= 0"),
    ],
)
def test_invalid_values_raise_config_error(field, value, match):
    with pytest.raises(ConfigError, match=match):
        QuantConfig(**{field: value})
    with pytest.raises(ConfigError, match=match):
        QuantConfig().replace(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("percentile", "high"),
        ("max_batches", "3"),
        ("fidelity_batches", "2"),
    ],
)
def test_wrongly_typed_python_options_raise_config_error(field, value):
    # quantize(**options) passes Python values straight to QuantConfig: a wrong type is a user
    # error (ConfigError naming the field), not a ValueError/TypeError from a comparison.
    with pytest.raises(ConfigError, match=field):
        QuantConfig(**{field: value})


def test_from_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        QuantConfig.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        QuantConfig.from_yaml(bad)
    assert "\n" not in str(info.value)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a mapping of options, got list"):
        QuantConfig.from_yaml(listing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert QuantConfig.from_yaml(empty) == QuantConfig()


def test_from_yaml_never_runs_code(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("method: !!python/object/apply:os.system ['echo pwned']\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        QuantConfig.from_yaml(evil)


def test_node_excluded_reports_the_matching_pattern():
    cfg = QuantConfig(exclude=("head/*",), overrides=(Override(op_type="Mat*", exclude=True),))
    assert cfg.node_excluded("head/fc", "Gemm") == "--exclude head/*"
    assert cfg.node_excluded("body/mm", "MatMul") == "override (op_type=Mat*) exclude"
    assert cfg.node_excluded("body/conv", "Conv") is None


def test_tensor_overrides_never_match_nodes():
    ov = Override(tensor="skip", exclude=True)
    assert not ov.matches_node("skip", "Add")
    assert ov.matches_tensor("skip") and not ov.matches_tensor("skip2")
    cfg = QuantConfig(overrides=(ov,))
    assert cfg.tensor_excluded("skip") == "override (tensor=skip) exclude"
    assert cfg.node_excluded("skip", "Add") is None


def test_settings_for_last_matching_override_wins():
    cfg = QuantConfig(
        method="percentile",
        overrides=(
            Override(op_type="Conv", method="entropy"),
            Override(node="conv2", method="mse"),
            Override(tensor="other", method="minmax"),
        ),
    )
    assert cfg.settings_for("t", [("conv1", "Conv")]).method == "entropy"
    assert cfg.settings_for("t", [("conv1", "Conv"), ("conv2", "Conv")]).method == "mse"
    assert cfg.settings_for("t", [("add", "Add")]).method == "percentile"
    assert cfg.settings_for("other", [("conv2", "Conv")]).method == "minmax"


def test_every_method_name_is_accepted():
    for name in METHODS:
        assert QuantConfig(method=name).method == name


def test_python_overrides_and_preprocess_given_as_dicts_are_normalised():
    cfg = QuantConfig(
        overrides=[{"op_type": "Gemm", "exclude": True}], preprocess={"scale": "1/255"}
    )
    assert cfg.overrides == (Override(op_type="Gemm", exclude=True),)
    assert isinstance(cfg.preprocess, str)


def test_a_value_error_in_a_config_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("percentile: 0\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: percentile: must be in \(0, 100\]"):
        QuantConfig.from_yaml(bad)
    bad.write_text("overrides:\n  - {node: a}\n  - {node: b, bits: 17}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: overrides\[1\]\.bits: must be"):
        QuantConfig.from_yaml(bad)


def test_unmatched_lists_patterns_and_overrides_that_match_nothing():
    cfg = QuantConfig(
        exclude=("conv*", "nomatch"),
        overrides=(
            Override(node="x*", method="mse"),
            Override(tensor="x*", method="mse"),  # --method-for
            Override(op_type="Gemm", exclude=True),
        ),
    )
    nodes, tensors = [("conv1", "Conv"), ("x1", "Relu")], {"t", "u"}
    assert cfg.unmatched(nodes, tensors) == ["--exclude 'nomatch'", "override (op_type=Gemm)"]
