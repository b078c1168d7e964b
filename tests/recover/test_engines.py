"""onnxq.recover.engines: AdaRound's engines by name."""

from __future__ import annotations

import pytest

from onnxq.config.recovery import ADAROUND_ENGINES
from onnxq.errors import ConfigError
from onnxq.recover.engines import ENGINES, get_engine


def test_engines_by_name():
    assert get_engine("numpy").conv().name == "numpy" and not get_engine("numpy").layer_in_torch
    pytest.importorskip("torch")
    assert get_engine("torch").conv().name == "torch" and get_engine("torch").layer_in_torch


def test_the_registry_holds_the_configs_engines():
    assert tuple(ENGINES) == ADAROUND_ENGINES


def test_an_unknown_engine_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown AdaRound engine 'jax'; valid: numpy, torch"):
        get_engine("jax")
