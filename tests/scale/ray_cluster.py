"""A real local Ray cluster for the scale tests: two raylets of one CPU each on this machine,
and this process connected to them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest


@contextlib.contextmanager
def local_cluster(test_module: ModuleType) -> Iterator[Any]:
    """The ``ray`` module, connected to a fresh two-node cluster for the ``with`` block; the test
    is skipped where Ray is not installed.  Workers unpickle ``test_module``'s functions by
    value (they cannot import ``tests``)."""
    ray = pytest.importorskip("ray", reason="needs ray: pip install 'onnxq[ray]'")
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(test_module)
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        nodes.shutdown()
