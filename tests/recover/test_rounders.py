"""onnxq.recover.rounders: the weight rounders by name."""

from __future__ import annotations

import pytest

from onnxq.config.recovery import ADAROUND_MODES
from onnxq.errors import ConfigError
from onnxq.recover.rounders import ROUNDERS, block_rounding, get_rounder, sequential_rounding


def test_the_registry_holds_the_configs_modes_in_order():
    assert tuple(ROUNDERS) == ADAROUND_MODES
    assert get_rounder("block") is block_rounding
    assert get_rounder("sequential") is sequential_rounding


def test_an_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown AdaRound mode 'greedy'; valid: block, float"):
        get_rounder("greedy")
