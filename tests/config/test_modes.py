"""Each kind of run refuses the options it would ignore, in one line that names the option."""

from __future__ import annotations

import dataclasses

import pytest

from onnxq.config import QuantConfig
from onnxq.config.modes import DYNAMIC_IGNORES, WEIGHT_ONLY_FIELDS, WEIGHT_ONLY_READS, refuse_unused
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
}
NOT_DEFAULT.pop("adaround_engine")  # its only other value (torch) needs torch installed


def test_every_option_a_weight_only_run_does_not_read_has_a_case():
    fields = {f.name for f in dataclasses.fields(QuantConfig)}
    assert fields - WEIGHT_ONLY_READS - {"adaround_engine"} == set(NOT_DEFAULT)


@pytest.mark.parametrize("name", sorted(NOT_DEFAULT))
def test_a_weight_only_run_refuses_an_option_it_does_not_read(name):
    cfg = QuantConfig(weight_only="int4", **{name: NOT_DEFAULT[name]})
    with pytest.raises(ConfigError) as caught:
        refuse_unused(cfg)
    text = str(caught.value)
    assert "\n" not in text and name.split("_")[0] in text and "drop" in text


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"target": "cosine=0.99"}, "target_accuracy"),
        ({"heldout": []}, "heldout"),
        ({"executor": object()}, "executor"),
    ],
)
def test_a_weight_only_run_refuses_the_static_call_options(given, named):
    with pytest.raises(ConfigError, match=rf"^{named}: weight-only quantization .* drop {named}"):
        refuse_unused(QuantConfig(weight_only="int8"), **given)


def test_a_weight_only_run_takes_its_own_options_and_smoothquant_off():
    cfg = QuantConfig(
        weight_only="int4", block_size=32, weight_algorithm="rtn", weight_symmetric=False,
        exclude=("head",), max_batches=2, fidelity_batches=1, progress=False, simplify=False,
        backend="onnxruntime", smoothquant=0.0,
    )  # fmt: skip
    refuse_unused(cfg, target=None, heldout=None, executor=None)


@pytest.mark.parametrize("name", DYNAMIC_IGNORES)
def test_a_dynamic_run_refuses_a_static_option(name):
    value = {"adaround": True, **NOT_DEFAULT}[name]
    cfg = QuantConfig(backend="onnxruntime", dynamic=True, **{name: value})
    with pytest.raises(ConfigError, match=rf"^{name} applies to static quantization: .*drop"):
        refuse_unused(cfg)
    refuse_unused(QuantConfig(backend="onnxruntime", **{name: value}))  # a static run reads it


def test_a_dynamic_run_takes_the_float_rewrites_and_its_weight_scales():
    cfg = QuantConfig(
        backend="onnxruntime", dynamic=True, cle=True, smoothquant=0.5, dw_equalization=4.0,
        dynamic_weight_scales="channel", target_accuracy="cosine=0.99",
    )  # fmt: skip
    refuse_unused(cfg)


@pytest.mark.parametrize("name", WEIGHT_ONLY_FIELDS)
def test_static_and_dynamic_runs_refuse_the_weight_only_fields(name):
    value = {"block_size": 32, "weight_algorithm": "gptq", "weight_symmetric": False}.get(name, 2)
    for dynamic in (False, True):
        cfg = QuantConfig(backend="onnxruntime", dynamic=dynamic, **{name: value})
        with pytest.raises(ConfigError, match=rf"^{name} applies to weight-only .* --weights"):
            refuse_unused(cfg)


def test_a_static_run_refuses_the_dynamic_weight_scales():
    with pytest.raises(ConfigError, match=r"^dynamic_weight_scales applies to --dynamic alone"):
        refuse_unused(QuantConfig(dynamic_weight_scales="tensor"))
