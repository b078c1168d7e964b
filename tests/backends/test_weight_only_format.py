"""onnxq.backends.weight_only_format: each profile's weight-only format is data."""

from __future__ import annotations

from onnxq.backends.profile import PROFILES
from onnxq.backends.weight_only_format import WeightOnlyFormat


def test_every_profile_names_a_writer_and_its_widths():
    for profile in PROFILES.values():
        fmt = profile.weight_only
        assert isinstance(fmt, WeightOnlyFormat)
        assert fmt.writer in ("matmul_nbits", "dequantize_linear")
        assert fmt.blocked_bits <= fmt.bits and fmt.min_block_size >= 1
