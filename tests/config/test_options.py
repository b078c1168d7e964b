"""The sections are the one declaration of every option: QuantConfig is made of them, takes
and reads fields by name or by section, and checks each field's type and value."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from onnxq.config import QuantConfig
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import ProfileOptions, WeightOptions
from onnxq.config.overrides import Override
from onnxq.config.placement import PlacementOptions
from onnxq.config.recovery import RecoveryOptions
from onnxq.config.sections import SECTION_TYPES, SECTIONS
from onnxq.errors import ConfigError


def test_quantconfig_is_its_sections_and_declares_no_field_of_its_own():
    assert [f.name for f in dataclasses.fields(QuantConfig)] == list(SECTIONS)
    for name, (_, cls) in SECTION_TYPES.items():
        assert isinstance(getattr(QuantConfig(), name), cls)
    names = QuantConfig.field_names()
    assert len(names) == len(set(names))  # each field in one section


def test_the_sections_carry_the_configs_values():
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
    assert tuned.profile == ProfileOptions("onnxruntime", False, None, "x86-avx2", "t.json")


def test_sections_and_named_fields_combine():
    cfg = QuantConfig(recovery=RecoveryOptions(adaround=True), adaround_steps=7, cle=True)
    assert (cfg.adaround, cfg.adaround_steps, cfg.cle) == (True, 7, True)
    assert cfg.replace(adaround=False).recovery == RecoveryOptions(adaround_steps=7, cle=True)
    assert cfg.replace(calibration=CalibrationOptions(max_batches=2)).max_batches == 2
    assert cfg == QuantConfig(adaround=True, adaround_steps=7, cle=True)
    assert hash(cfg) == hash(QuantConfig(adaround=True, adaround_steps=7, cle=True))


def test_an_unknown_option_or_a_wrong_section_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^config: unknown option 'adarond'; valid options"):
        QuantConfig(adarond=True)
    with pytest.raises(ConfigError, match="recovery: expected a RecoveryOptions, got"):
        QuantConfig(recovery=PlacementOptions())  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="no option 'adarond'"):
        _ = QuantConfig().adarond


def test_to_dict_is_flat_and_to_yaml_nested_by_section():
    cfg = QuantConfig(adaround=True, backend="onnxruntime")
    flat = cfg.to_dict()
    assert list(flat) == QuantConfig.field_names() and flat["adaround"] is True
    nested = yaml.safe_load(cfg.to_yaml())
    assert list(nested) == list(SECTIONS) and nested["recovery"]["adaround"] is True
    assert QuantConfig.from_dict(nested) == cfg == QuantConfig.from_dict(flat)


def test_a_section_checks_its_values_when_built_alone():
    with pytest.raises(ConfigError, match="adaround_steps: must be >= 0"):
        RecoveryOptions(adaround_steps=-1)
    with pytest.raises(ConfigError, match="config: max_batches: expected"):
        CalibrationOptions(max_batches="3")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", QuantConfig.field_names())
def test_every_field_refuses_a_value_of_another_type_naming_the_field(name):
    # the types come from the annotations: no field can lack a type check
    with pytest.raises(ConfigError, match=f"config: {name}: expected"):
        QuantConfig.from_dict({name: object()})
    with pytest.raises(ConfigError, match=f"config: {name}: expected"):
        QuantConfig(**{name: object()})
