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
