"""The recipes: each kind of run holds the sections it reads and refuses, at construction, the
options it would ignore, in one line that names the option."""

from __future__ import annotations

import pytest

from onnxq.config import QuantConfig
from onnxq.config.calibration import CalibrationOptions
from onnxq.config.options import ProfileOptions
from onnxq.config.placement import PlacementOptions
from onnxq.config.recipes import (
    DYNAMIC_IGNORES,
    WEIGHT_ONLY_READS,
    DynamicRecipe,
    StaticRecipe,
    WeightOnlyRecipe,
    recipe_for,
    refuse_call_options,
)
from onnxq.config.recovery import RecoveryOptions
from onnxq.config.sections import SECTION_OF, SECTIONS
from onnxq.config.weightonly import WeightOnlyOptions
from onnxq.errors import ConfigError

# a value other than the default for every option a weight-only run does not read
NOT_DEFAULT = {
    "method": "minmax",
    "percentile": 99.9,
    "exclude_op_types": ("Softmax",),
    "exclude_modules": ("encoder.*",),
    "weight_storage": "qdq",
    "weight_method": "minmax",
    "bias_correction": True,
    "min_channels": 4,
    "mask_threshold": 1e3,
    "concat_range_ratio": 4.0,
    "weak_channel_fraction": 0.5,
    "weak_position_fraction": 0.5,
    "precision": "int16",
    "dynamic": True,
    "dynamic_weight_scales": "channel",
    "score_map_ranges": "minmax",
    "reduce_range": True,
    "target_cpu": "arm64",
    "cost_table": "table.json",
    "memory_budget_mb": 1024,
    "histogram_sample": 0,
    "histogram_budget": 0,
    "agreement_threshold": 0.4,
    "target_accuracy": "cosine=0.999",
    "heldout_batches": 4,
    "target_cost": "macs",
    "target_max_float_macs": 0.1,
    "device": "cuda",
    "cle": True,
    "dw_equalization": 4.0,
    "shift_activations": True,
    "smoothquant": 0.5,
    "smoothquant_min_spread": 4.0,
    "calibration_mode": "prefix",
    "adaround": True,
    "adaround_steps": 10,
    "adaround_rows": 64,
    "adaround_engine": "numpy",  # the default: replaced below
    "adaround_mode": "sequential",
    "sequential_correction": True,
    "range_search": True,
    "range_search_batches": 4,
    "high_precision": "fp16",
    "keep_io_types": False,
    "save_calibration": "stats.json",
    "load_calibration": "stats.json",
}
NOT_DEFAULT.pop("adaround_engine")  # its only other value (torch) needs torch installed


WEIGHT_ONLY_FIELDS = [n for n in SECTIONS["weightonly"][1] if n != "weight_only"]
READ_BY_WEIGHT_ONLY = {
    name
    for section, names in WEIGHT_ONLY_READS.items()
    for name in (SECTIONS[section][1] if names is None else names)
}
DYNAMIC_IGNORED = [name for names in DYNAMIC_IGNORES.values() for name in names]


def test_every_option_a_weight_only_run_does_not_read_has_a_case():
    fields = set(QuantConfig.field_names())
    assert fields - READ_BY_WEIGHT_ONLY - {"adaround_engine"} == set(NOT_DEFAULT)


@pytest.mark.parametrize("name", sorted(NOT_DEFAULT))
def test_a_weight_only_run_refuses_an_option_it_does_not_read(name):
    cfg = QuantConfig(weight_only="int4", **{name: NOT_DEFAULT[name]})
    with pytest.raises(ConfigError) as caught:
        cfg.recipe()
    text = str(caught.value)
    assert "\n" not in text and name.split("_")[0] in text and "drop" in text


@pytest.mark.parametrize(
    ("given", "named"),
    [({"target": "cosine=0.99"}, "target_accuracy"), ({"executor": object()}, "executor")],
)
def test_a_weight_only_run_refuses_the_static_call_options(given, named):
    recipe = QuantConfig(weight_only="int8").recipe()
    with pytest.raises(ConfigError, match=rf"^{named}: weight-only quantization .* drop {named}"):
        refuse_call_options(recipe, **given)
    refuse_call_options(QuantConfig().recipe(), **given)  # a static run takes them


def test_a_weight_only_run_takes_its_own_options_and_smoothquant_off():
    cfg = QuantConfig(
        weight_only="int4", block_size=32, weight_algorithm="rtn", weight_symmetric=False,
        exclude=("head",), max_batches=2, fidelity_batches=1, progress=False, simplify=False,
        backend="onnxruntime", smoothquant=0.0, batch_size=4,
    )  # fmt: skip
    recipe = cfg.recipe()
    assert isinstance(recipe, WeightOnlyRecipe)
    assert recipe.weightonly == cfg.weightonly and recipe.calibration.batch_size == 4
    refuse_call_options(recipe, target=None, executor=None)


def test_a_weight_only_recipe_cannot_hold_a_static_section():
    recipe = QuantConfig(weight_only="int4").recipe()
    for section in ("recovery", "accuracy", "weights", "validate"):
        assert not hasattr(recipe, section)
    with pytest.raises(TypeError):
        WeightOnlyRecipe(WeightOnlyOptions(weight_only="int4"), recovery=RecoveryOptions())  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="needs weight_only"):
        WeightOnlyRecipe(WeightOnlyOptions())


def test_a_recipe_built_directly_refuses_what_its_kind_ignores():
    with pytest.raises(ConfigError, match=r"^method applies to static quantization"):
        DynamicRecipe(placement=PlacementOptions(method="minmax"))
    with pytest.raises(ConfigError, match=r"^percentile: weight-only"):
        WeightOnlyRecipe(
            WeightOnlyOptions(weight_only="int4"), calibration=CalibrationOptions(percentile=99.0)
        )
    with pytest.raises(ConfigError, match="use DynamicRecipe"):
        StaticRecipe(profile=ProfileOptions(backend="onnxruntime", dynamic=True))
    assert DynamicRecipe(profile=ProfileOptions(backend="onnxruntime")).profile.dynamic


def test_the_kind_follows_the_options():
    assert type(QuantConfig().recipe()) is StaticRecipe
    assert type(QuantConfig(backend="onnxruntime", dynamic=True).recipe()) is DynamicRecipe
    assert type(recipe_for(QuantConfig(weight_only="int8"))) is WeightOnlyRecipe
    recipe = QuantConfig(adaround=True, exclude=("a*",)).recipe()
    assert recipe.recovery.adaround and recipe.placement.exclude == ("a*",)
    assert recipe.to_dict()["adaround"] is True and "block_size" not in recipe.to_dict()


@pytest.mark.parametrize("name", DYNAMIC_IGNORED)
def test_a_dynamic_run_refuses_a_static_option(name):
    value = {"adaround": True, **NOT_DEFAULT}[name]
    cfg = QuantConfig(backend="onnxruntime", dynamic=True, **{name: value})
    with pytest.raises(ConfigError, match=rf"^{name} applies to static quantization: .*drop"):
        cfg.recipe()
    QuantConfig(backend="onnxruntime", **{name: value}).recipe()  # a static run reads it


@pytest.mark.parametrize("name", ["save_calibration", "load_calibration"])
def test_a_dynamic_run_refuses_a_calibration_cache(name):
    cfg = QuantConfig(backend="onnxruntime", dynamic=True, **{name: "stats.json"})
    with pytest.raises(ConfigError, match="keeps no calibration statistics"):
        cfg.recipe()


def test_a_dynamic_run_takes_the_float_rewrites_and_its_weight_scales():
    cfg = QuantConfig(
        backend="onnxruntime", dynamic=True, cle=True, smoothquant=0.5, dw_equalization=4.0,
        dynamic_weight_scales="channel", target_accuracy="cosine=0.99",
    )  # fmt: skip
    assert isinstance(cfg.recipe(), DynamicRecipe)


@pytest.mark.parametrize("name", WEIGHT_ONLY_FIELDS)
def test_static_and_dynamic_runs_refuse_the_weight_only_fields(name):
    value = {"block_size": 32, "weight_algorithm": "gptq", "weight_symmetric": False}.get(name, 2)
    for dynamic in (False, True):
        cfg = QuantConfig(backend="onnxruntime", dynamic=dynamic, **{name: value})
        with pytest.raises(ConfigError, match=rf"^{name} applies to weight-only .* --weights"):
            cfg.recipe()


def test_a_static_run_refuses_the_dynamic_weight_scales():
    with pytest.raises(ConfigError, match=r"^dynamic_weight_scales applies to --dynamic alone"):
        QuantConfig(dynamic_weight_scales="tensor").recipe()


def test_contradicting_options_are_refused_at_construction():
    with pytest.raises(ConfigError, match="bias_correction corrects"):
        QuantConfig(backend="onnxruntime", dynamic=True, bias_correction=True).recipe()
    with pytest.raises(ConfigError, match="shift_activations with adaround_mode sequential"):
        QuantConfig(shift_activations=True, adaround=True, adaround_mode="sequential").recipe()
    QuantConfig(shift_activations=True, adaround=True).recipe()  # float mode: fine


def test_every_field_has_one_section_the_recipes_know():
    assert set(SECTION_OF) == set(QuantConfig.field_names())
    for kind in (StaticRecipe, DynamicRecipe, WeightOnlyRecipe):
        assert set(kind.SECTIONS) <= set(SECTIONS)
