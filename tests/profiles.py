"""Backend profiles the tests share."""

from __future__ import annotations

from onnxq.backends.profile import PROFILES

# The onnxruntime profile without its cost rules (onnxq.rewrites.cost: depthwise convs, small
# ops and chain ops stay float outside chains of integer kernels), which would keep most tiny
# test graphs float; tests/rewrites/test_cost.py covers the rules with the real profile.
ONNXRUNTIME_NO_COST = PROFILES["onnxruntime"].replace(
    float_grouped_convs=False,
    min_macs_per_output=0,
    min_macs=0,
    chain_ops=frozenset(),
    nhwc_only_ops=frozenset(),
)
