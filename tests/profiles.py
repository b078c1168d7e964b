"""Backend profiles the tests share."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from onnxq.backends.cost_tables import SHIPPED
from onnxq.backends.profile import PROFILES

# The onnxruntime profile without its cost rules (onnxq.place.rules.cost: depthwise convs, small
# ops and chain ops stay float outside chains of integer kernels), which would keep most tiny
# test graphs float; tests/place/rules/test_cost.py covers the rules with the real profile.
ONNXRUNTIME_NO_COST = PROFILES["onnxruntime"].replace(
    float_grouped_convs=False,
    min_macs_per_output=0,
    min_macs=0,
    chain_ops=frozenset(),
    nhwc_only_ops=frozenset(),
)
# quantize() takes the thresholds from the target CPU class's cost table
NO_COST_TABLES = {
    name: dataclasses.replace(table, float_grouped_convs=False, min_macs_per_output=0, min_macs=0)
    for name, table in SHIPPED.items()
}


@contextlib.contextmanager
def no_cost_rules() -> Iterator[None]:
    """The onnxruntime profile and every shipped cost table without cost rules, for the
    duration of the block."""
    saved_profile, saved_tables = PROFILES["onnxruntime"], dict(SHIPPED)
    PROFILES["onnxruntime"] = ONNXRUNTIME_NO_COST
    SHIPPED.update(NO_COST_TABLES)
    try:
        yield
    finally:
        PROFILES["onnxruntime"] = saved_profile
        SHIPPED.update(saved_tables)
