"""docs/config.md documents every QuantConfig and Override field and what each recipe refuses,
and its examples load."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from onnxq.cli.parser import build_parser
from onnxq.config import BACKENDS, WEIGHT_STORAGE, Override, QuantConfig
from onnxq.config.recipes import (
    DYNAMIC_IGNORES,
    WEIGHT_ONLY_READS,
    DynamicRecipe,
    StaticRecipe,
    WeightOnlyRecipe,
)
from onnxq.config.sections import SECTION_OF, SECTIONS
from onnxq.errors import ConfigError
from onnxq.numerics.observers import METHODS

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _section(heading: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _table(heading: str) -> dict[str, dict[str, str]]:
    """``| `field` | type | default | allowed | CLI flag |`` rows of a section, by field."""
    rows = {}
    for line in _section(heading).splitlines():
        match = re.match(r"\|\s*`(\w+)`\s*\|", line)
        if match:
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 5, line
            rows[match.group(1)] = dict(
                zip(("field", "type", "default", "allowed", "cli"), cells, strict=True)
            )
    return rows


def _yaml_blocks(heading: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", _section(heading), re.DOTALL)


def _default(cell: str) -> object:
    return yaml.safe_load(cell.strip("`"))


@pytest.mark.parametrize(
    ("fields", "heading"),
    [
        (QuantConfig.field_names(), "QuantConfig fields"),
        ([f.name for f in dataclasses.fields(Override)], "Override fields"),
    ],
)
def test_every_field_is_documented_and_nothing_else(fields, heading):
    rows = _table(heading)
    assert sorted(rows) == sorted(fields), "docs/config.md is out of date with " + heading
    details = _section(heading)
    for name in fields:
        assert f"**`{name}`**" in details, f"{name}: no description under '{heading}'"


def test_documented_defaults_are_the_real_defaults():
    real = QuantConfig().to_dict()
    for name, row in _table("QuantConfig fields").items():
        assert _default(row["default"]) == real[name], name
    for f in dataclasses.fields(Override):
        assert _default(_table("Override fields")[f.name]["default"]) == f.default, f.name


def test_documented_choices_are_the_real_choices():
    rows = _table("QuantConfig fields")

    def values(name: str) -> set[str]:
        return set(re.findall(r"`([^`]+)`", rows[name]["allowed"]))

    assert values("backend") == set(BACKENDS)
    assert values("method") == set(METHODS)
    assert values("weight_storage") == set(WEIGHT_STORAGE)


def test_documented_cli_flags_exist():
    quantize = next(a for a in build_parser()._actions if a.dest == "command").choices["quantize"]
    flags = {s for action in quantize._actions for s in action.option_strings}
    documented = {
        flag
        for row in _table("QuantConfig fields").values()
        for flag in re.findall(r"(?<![\w-])--?[a-z][a-z-]*", row["cli"])
    }
    assert documented, "no CLI flags found in the table"
    assert documented <= flags, documented - flags


def test_a_field_without_a_flag_names_its_set_form():
    for name, row in _table("QuantConfig fields").items():
        for setting in re.findall(r"--set (\w+)\.(\w+)=", row["cli"]):
            assert setting == (SECTION_OF[name], name), row["cli"]


def test_the_field_table_runs_section_by_section():
    assert list(_table("QuantConfig fields")) == QuantConfig.field_names()


def test_full_example_loads_sets_every_field_and_round_trips(tmp_path):
    (block,) = _yaml_blocks("Full example")
    data = yaml.safe_load(block)
    assert list(data) == list(SECTIONS), "the example's sections, in order"
    for section, fields in data.items():
        assert list(fields) == list(SECTIONS[section][1]), f"{section}: every field, in order"
    path = tmp_path / "quant.yaml"
    path.write_text(block, encoding="utf-8")
    cfg = QuantConfig.from_yaml(path)
    assert cfg != QuantConfig()
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml(), encoding="utf-8")
    assert QuantConfig.from_yaml(again) == cfg
    with pytest.raises(ConfigError):  # the options of every kind of run: no recipe takes them
        cfg.recipe()


def test_recipe_examples_load_and_build_their_recipes(tmp_path):
    kinds = []
    for i, block in enumerate(_yaml_blocks("Recipes")):
        path = tmp_path / f"recipe{i}.yaml"
        path.write_text(block, encoding="utf-8")
        cfg = QuantConfig.from_yaml(path)
        assert cfg != QuantConfig()
        kinds.append(cfg.recipe().KIND)
    assert kinds == ["static", "weight-only"]


def _recipe_table() -> dict[str, dict[str, str]]:
    """``| `section` | static | dynamic | weight-only |`` rows of the Recipes section."""
    rows = {}
    for line in _section("Recipes").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0].strip("`") in SECTIONS:
            kinds = ("static", "dynamic", "weight-only")
            rows[cells[0].strip("`")] = dict(zip(kinds, cells[1:], strict=True))
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`(\w+)`", cell))


def test_recipe_table_says_what_each_kind_holds_and_refuses():
    rows = _recipe_table()
    assert list(rows) == list(SECTIONS)
    dynamic = {s: set(names) for s, names in DYNAMIC_IGNORES.items()}
    dynamic["calibration"] |= {"save_calibration", "load_calibration"}  # refused one by one
    dynamic["recovery"] |= {"bias_correction"}
    refused = {"static": {"placement": {"dynamic_weight_scales"}}, "dynamic": dynamic}
    holds = {
        "static": StaticRecipe.SECTIONS,
        "dynamic": DynamicRecipe.SECTIONS,
        "weight-only": WeightOnlyRecipe.SECTIONS,
    }
    for section, row in rows.items():
        for kind, cell in row.items():
            where = f"{kind} / {section}: {cell}"
            if section not in holds[kind]:
                assert cell == "not held", where
            elif kind == "weight-only" and WEIGHT_ONLY_READS[section] is not None:
                assert cell.endswith(" only"), where
                assert _names(cell) == set(WEIGHT_ONLY_READS[section] or ()), where
            else:
                assert cell.startswith("every field"), where
                assert _names(cell) == refused.get(kind, {}).get(section, set()), where


def test_default_config_round_trips(tmp_path):
    path = tmp_path / "default.yaml"
    path.write_text(QuantConfig().to_yaml(), encoding="utf-8")
    assert QuantConfig.from_yaml(path) == QuantConfig()


def test_sparsebit_example_loads_as_sparsebit_and_round_trips(tmp_path):
    (block,) = _yaml_blocks("Sparsebit qconfig files")
    path = tmp_path / "qconfig.yaml"
    path.write_text(block, encoding="utf-8")
    cfg = QuantConfig.from_yaml(path)
    assert (cfg.backend, cfg.method, cfg.percentile) == ("tensorrt", "percentile", 99.99)
    assert cfg.exclude == ("/head*/*",)
    assert Override(node="*/layer4[._/]1[._/]conv2/*", bits=4) in cfg.overrides
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml(), encoding="utf-8")
    assert QuantConfig.from_yaml(again) == cfg
