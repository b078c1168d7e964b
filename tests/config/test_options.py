"""The stage options are views over QuantConfig: same field names, same declared types, values
taken from the config (one declaration per field, in QuantConfig)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from onnxq.config import QuantConfig
from onnxq.config.options import (
    CalibrationOptions,
    PlacementOptions,
    RecoveryOptions,
    TargetOptions,
    WeightOptions,
)
from onnxq.config.overrides import Override
from onnxq.errors import ConfigError


@pytest.mark.parametrize(
    "view", [TargetOptions, PlacementOptions, CalibrationOptions, WeightOptions, RecoveryOptions]
)
def test_every_stage_option_is_a_quantconfig_field_of_the_same_type(view):
    config = typing.get_type_hints(QuantConfig)
    for name, hint in typing.get_type_hints(view).items():
        assert name in config, f"{view.__name__}.{name} is not a QuantConfig field"
        assert hint == config[name], f"{view.__name__}.{name}: {hint} != {config[name]}"


def test_the_views_carry_the_configs_values():
    cfg = QuantConfig(
        method="mse",
        exclude=("head*",),
        overrides=(Override(node="a", bits=4),),
        mask_threshold=50.0,
        max_batches=3,
        percentile=99.0,
        weight_storage="qdq",
    )
    assert cfg.placement.method == "mse" and cfg.placement.exclude == ("head*",)
    assert cfg.placement.overrides == cfg.overrides and cfg.placement.mask_threshold == 50.0
    assert (cfg.calibration.max_batches, cfg.calibration.percentile) == (3, 99.0)
    assert cfg.weights == WeightOptions(weight_storage="qdq", weight_method="mse")
    tuned = QuantConfig(backend="onnxruntime", target_cpu="x86-avx2", cost_table="t.json")
    assert tuned.target == TargetOptions(
        "onnxruntime", None, "x86-avx2", "t.json", "int8", False, ()
    )


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(QuantConfig)])
def test_every_field_refuses_a_value_of_another_type_naming_the_field(name):
    # the types come from the annotations: no field can lack a type check
    with pytest.raises(ConfigError, match=f"config: {name}: expected"):
        QuantConfig.from_dict({name: object()})
    with pytest.raises(ConfigError, match=f"config: {name}: expected"):
        QuantConfig(**{name: object()})
