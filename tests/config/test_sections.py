"""The config's sections: every field in exactly one, nested YAML, ``--set`` parsing."""

from __future__ import annotations

import dataclasses

import pytest

from onnxq.config import QuantConfig
from onnxq.config.sections import SECTION_OF, SECTIONS, flatten, parse_setting
from onnxq.errors import ConfigError


def test_every_field_is_in_exactly_one_section():
    fields = QuantConfig.field_names()
    listed = [name for _, names in SECTIONS.values() for name in names]
    assert len(listed) == len(set(listed)), "a field in two sections"
    assert sorted(listed) == sorted(fields)
    assert not set(SECTIONS) & set(fields), "a section named like a field"
    assert [f.name for f in dataclasses.fields(QuantConfig)] == list(SECTIONS)


def test_yaml_may_nest_fields_under_their_sections(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "recovery:\n  adaround: true\n  adaround_steps: 10\ncalibration: {percentile: 99.9}\n"
    )
    flat = tmp_path / "flat.yaml"
    flat.write_text("adaround: true\nadaround_steps: 10\npercentile: 99.9\n")
    assert QuantConfig.from_yaml(nested) == QuantConfig.from_yaml(flat)
    assert QuantConfig.from_yaml(nested).adaround_steps == 10


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"recovery": {"percentile": 99.0}}, "'percentile' is in section 'calibration'"),
        ({"recovery": True}, "section 'recovery' must be a mapping"),
        ({"adaround": True, "recovery": {"adaround": False}}, "'adaround' is given twice"),
        ({"recovery": {"nonsense": 1}}, "valid fields of recovery: cle"),
    ],
)
def test_a_misplaced_field_is_refused_with_where_it_belongs(data, says):
    with pytest.raises(ConfigError, match=r"x\.yaml") as err:
        QuantConfig.from_dict(data, where="x.yaml")
    assert says in str(err.value)


def test_flatten_passes_flat_keys_through():
    assert flatten({"method": "mse", "placement": {"min_channels": 4}}, "c") == {
        "method": "mse",
        "min_channels": 4,
    }
    assert SECTION_OF["adaround"] == "recovery"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("recovery.adaround=true", ("adaround", True)),
        ("calibration.percentile=99.9", ("percentile", 99.9)),
        ("accuracy.target_max_float_macs=10%", ("target_max_float_macs", "10%")),
        ("placement.exclude=[a, '/b/*']", ("exclude", ["a", "/b/*"])),
        ("weightonly.block_size=0", ("block_size", 0)),
        ("calibration.max_batches=", ("max_batches", None)),
    ],
)
def test_parse_setting_reads_values_as_yaml(text, expected):
    assert parse_setting(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("adaround=true", "expected SECTION.FIELD=VALUE"),
        ("recovery.adaround", "expected SECTION.FIELD=VALUE"),
        ("nosuch.adaround=1", "unknown section 'nosuch'; valid: profile, placement"),
        ("calibration.adaround=1", "'adaround' is in section 'recovery': recovery.adaround"),
    ],
)
def test_parse_setting_refuses_bad_text(text, says):
    with pytest.raises(ConfigError) as err:
        parse_setting(text)
    assert says in str(err.value)


def test_docs_config_lists_the_sections():
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    rows = {}
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].strip("`") in SECTIONS:
            rows[cells[0].strip("`")] = tuple(n.strip(" `") for n in cells[1].split(","))
    assert list(rows.items()) == [(name, names) for name, (_, names) in SECTIONS.items()]
