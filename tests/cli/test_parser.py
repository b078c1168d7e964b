"""``onnxq quantize --help`` (the first hour's options), ``--help-all`` (every option by config
section) and ``--set``."""

from __future__ import annotations

import argparse
import re

import pytest

from onnxq.cli.parser import build_parser
from onnxq.cli.quantize import with_settings
from onnxq.cli.quantize_flags import FIRST_LEVEL
from onnxq.config.sections import SECTIONS
from onnxq.errors import ConfigError


def _quantize_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["quantize"]


def _options(help_text: str) -> list[str]:
    """The option lines of a help text (``  -o OUTPUT, --output OUTPUT`` ...)."""
    return re.findall(r"^  (-{1,2}[\w-]+)", help_text, flags=re.M)


def test_help_shows_at_most_25_options():
    text = _quantize_parser().format_help()
    shown = _options(text)
    assert 15 <= len(shown) <= 25, shown
    assert "--set" in shown and "--help-all" in shown and "--adaround" not in shown
    assert "--adaround" not in text.split("positional arguments")[0]  # nor in the usage line


def test_help_all_shows_every_option_grouped_by_section(capsys):
    q = _quantize_parser()
    with pytest.raises(SystemExit) as done:
        q.parse_args(["--help-all"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    every = {s for a in q._actions for s in a.option_strings if s.startswith("--")}
    assert every <= set(re.findall(r"--[\w-]+", text))
    for section in SECTIONS:
        assert f"\n  {section}: " in text  # the field listing
    recovery = text.index("\nrecovery: ")
    assert recovery < text.index("  --adaround, --no-adaround") < text.index("\naccuracy: ")
    assert "    recovery.adaround_rows=4096" in text  # a field no flag sets
    assert "    calibration.memory_budget_mb=4096  (--memory-budget)" in text


def test_every_hidden_option_has_a_section_group():
    q = _quantize_parser()
    titles = {g.title.split(":")[0]: g for g in q._action_groups}
    for action in q._actions:
        if action.dest in FIRST_LEVEL or not action.option_strings:
            continue
        owners = [t for t, g in titles.items() if action in g._group_actions and t in SECTIONS]
        assert owners, f"{action.option_strings} is neither first-level nor in a section group"


def test_set_applies_over_unset_flags_and_refuses_a_contradiction():
    assert with_settings({"adaround": None}, ["recovery.adaround=true"]) == {"adaround": True}
    assert with_settings({"percentile": 99.0}, ["calibration.percentile=99"]) == {"percentile": 99}
    with pytest.raises(ConfigError, match=r"a flag already sets percentile to 98\.0"):
        with_settings({"percentile": 98.0}, ["calibration.percentile=99"])
    with pytest.raises(ConfigError, match="already set by --set"):
        with_settings({}, ["recovery.cle=true", "recovery.cle=false"])


def test_help_all_lists_the_fields_of_moved_flags_under_set(capsys):
    from onnxq.cli.flags import MOVED

    q = _quantize_parser()
    assert not set(MOVED) & {s for a in q._actions for s in a.option_strings}
    with pytest.raises(SystemExit):
        q.parse_args(["--help-all"])
    lines = capsys.readouterr().out.splitlines()
    for path in MOVED.values():
        (line,) = [x for x in lines if x.startswith(f"    {path}=")]
        assert "(--" not in line  # no flag sets it now: --set alone
    assert "    calibration.histogram_sample=65536" in lines
    assert "    recovery.adaround_steps=500" in lines


def test_help_all_names_each_fields_flag_in_its_new_section(capsys):
    q = _quantize_parser()
    with pytest.raises(SystemExit):
        q.parse_args(["--help-all"])
    text = capsys.readouterr().out
    for line in [
        "    placement.precision='int8'  (--precision)",
        "    placement.shift_activations=False  (--shift-activations)",
        "    placement.overrides=[]  (--method-for)",
        "    calibration.progress=True  (--quiet)",
        "    calibration.batch_size=1  (--batch-size)",
        "    calibration.save_calibration=None  (--save-calibration)",
        "    recovery.cle=False  (--cle)",  # an on/off pair by its on flag
        "    recovery.smoothquant=0.8  (--smoothquant)",
    ]:
        assert line + "\n" in text, line
    assert "    calibration.fidelity_batches=4\n" in text


def test_a_flag_that_sets_a_field_is_grouped_under_the_fields_section():
    from onnxq.cli.quantize_flags import _FLAG_OF_FIELD
    from onnxq.config.sections import SECTION_OF

    q = _quantize_parser()
    field_of_flag = {flag: name for name, flag in _FLAG_OF_FIELD.items()}
    groups = {g.title.split(":")[0]: g._group_actions for g in q._action_groups}
    for action in q._actions:
        if action.dest in FIRST_LEVEL or not action.option_strings:
            continue
        name = field_of_flag.get(action.option_strings[-1], action.dest)
        if name in SECTION_OF:
            assert action in groups[SECTION_OF[name]], (action.option_strings, SECTION_OF[name])
