"""onnxq.config.sparsebit_fields: one Sparsebit section's fields as onnxq reads them."""

from __future__ import annotations

import pytest

from onnxq.config.sparsebit_fields import (
    bit_width,
    flat_keys,
    observer_method,
    per_channel_scheme,
    read_section,
    symmetric_scheme,
)
from onnxq.errors import ConfigError


def test_a_section_reads_as_flat_keys_with_its_specific_list():
    flat = read_section({"QUANTIZER": {"TYPE": "uniform", "BIT": 4}}, "W", "config")
    assert flat == {"QUANTIZER.TYPE": "uniform", "QUANTIZER.BIT": 4, "SPECIFIC": []}
    assert bit_width(flat, "W", "config", 8) == 4 and bit_width({}, "W", "config", 8) == 8
    assert flat_keys({"A": {"B": 1}}, "") == {"A.B": 1}


def test_schemes_and_observers():
    assert per_channel_scheme({"QSCHEME": "per-channel-symmetric"}, "config") is True
    assert symmetric_scheme({"QSCHEME": "per-tensor-affine"}, "config", "onnxruntime") is False
    assert observer_method({"OBSERVER.TYPE": "kl"}, "A", "config") == ("entropy", None)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"QUANTIZER": {"BIT": 9}}, "expected 2..8"),
        ({"QUANTIZER": {"TYPE": "lsq"}}, "is training-time"),
        ({"NOPE": 1}, "unknown key 'NOPE'"),
    ],
)
def test_a_field_onnxq_cannot_read_is_a_config_error(section, message):
    with pytest.raises(ConfigError, match=message):
        bit_width(read_section(section, "W", "config"), "W", "config", 8)
