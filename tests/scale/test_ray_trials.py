"""The accuracy target's sensitivity trials on a real local Ray cluster (two raylets on this
machine, one CPU each): the same ranking, kept layers and output bytes as in one process, the
same one-line errors, and Ctrl-C cancels the running trials.

Skipped where the ``ray`` package is not installed (``pip install 'onnxq[ray]'``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

import onnxq
import onnxq.mixed.sensitivity
from onnxq import ir
from onnxq.cli import main
from onnxq.config import QuantConfig
from onnxq.errors import ConfigError, ModelLoadError, ResourceError
from onnxq.ir import external
from onnxq.mixed.trials import TrialContext, TrialShard, score_trial, trial_worker
from onnxq.numerics.accuracy_target import AccuracyTarget, cosine
from onnxq.place.annotations import Annotations
from onnxq.scale import InProcess, RayExecutor
from tests import graphs
from tests.mixed.test_search import conv_chain
from tests.scale.ray_cluster import local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two raylets of one CPU each, and this process connected to them."""
    with local_cluster(sys.modules[__name__]) as ray:
        yield ray


def searched(model: onnx.ModelProto, target: Any, **options: Any) -> tuple[bytes, dict[str, Any]]:
    """The output bytes and the search record of a run with ``target``."""
    result = onnxq.quantize(
        model, graphs.random_batches(model, 16), progress=False, target=target, **options
    )
    return result.model.SerializeToString(), result.report.mixed_precision


@pytest.mark.parametrize(
    ("target", "backend"),
    [("cosine=0.99999", "tensorrt"), ("cosine=1.5", "tensorrt"), ("sqnr=40", "onnxruntime")],
)
def test_trials_on_ray_give_the_ranking_kept_layers_and_bytes_of_one_process(
    cluster, target, backend
):
    model = conv_chain(layers=6)
    single = searched(model, target, backend=backend)
    on_ray = searched(model, target, backend=backend, executor=RayExecutor())
    assert on_ray[1] == single[1]  # ranking, scores, kept layers, trial count
    assert on_ray[0] == single[0]
    # the search went past the ranking's L + 1 trials (bisection, pruning)
    assert single[1]["trials"] > len(single[1]["sensitivity"]) + 1


def _worst_error(reference: list[dict[str, Any]], quantized: list[dict[str, Any]]) -> float:
    pairs = zip(reference, quantized, strict=True)
    return -max(float(abs(r[k] - q[k]).max()) for r, q in pairs for k in r)


def test_a_callable_metric_runs_on_the_workers_with_the_same_result(cluster):
    target = AccuracyTarget(_worst_error, -0.05, name="neg_max_error")
    model = conv_chain()
    assert searched(model, target, executor=RayExecutor()) == searched(model, target)


class _KillsOnce:
    """The cosine metric, killing (SIGKILL) the first process that calls it where ``marker``
    does not exist yet: a worker dying mid-trial."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __call__(self, reference: Any, quantized: Any) -> float:
        if not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return cosine(reference, quantized)


def test_a_worker_killed_mid_trial_is_retried_and_the_result_is_the_same(cluster, tmp_path):
    target = AccuracyTarget(_KillsOnce(tmp_path / "killed"), 0.99999, name="cosine")
    model = conv_chain()
    on_ray = searched(model, target, executor=RayExecutor())
    assert (tmp_path / "killed").exists()  # a worker did die
    assert on_ray == searched(model, target)


def test_a_metric_error_on_a_worker_is_the_error_of_one_process(cluster):
    target = AccuracyTarget(lambda reference, quantized: "good", 0.5, name="bad")
    errors = []
    for executor in (None, RayExecutor()):
        with pytest.raises(ConfigError) as caught:
            searched(conv_chain(), target, executor=executor)
        errors.append(str(caught.value))
    assert "must return a number" in errors[0] and errors[1] == errors[0]


def test_a_worker_that_cannot_load_the_trials_says_what_to_install(cluster, tmp_path):
    (tmp_path / "driver_only_metrics.py").write_text(
        "def cosine_like(reference, quantized):\n    return 1.0\n"
    )
    sys.path.insert(0, str(tmp_path))  # this process imports it; the workers cannot
    try:
        from driver_only_metrics import cosine_like  # type: ignore[import-not-found]

        target = AccuracyTarget(cosine_like, 0.5)
        with pytest.raises(ResourceError) as caught:
            searched(conv_chain(), target, executor=RayExecutor())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("driver_only_metrics", None)
    message = str(caught.value)
    assert "driver_only_metrics" in message and "every node" in message
    assert "\n" not in message


def test_a_worker_that_cannot_read_the_weights_gives_the_error_of_one_process(
    cluster, tmp_path, monkeypatch
):
    model = conv_chain()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.data")
    monkeypatch.setattr(external, "LAZY_BYTES", 0)  # the weights stay in model.data
    lazy = ir.load_model(path)
    assert external.has_lazy(lazy)
    (tmp_path / "model.data").unlink()  # what a node without the shared folder sees
    profile, _ = QuantConfig().backend_profile()
    context = TrialContext(
        lazy, graphs.random_batches(model, 2), [], AccuracyTarget("cosine", 0.5), profile,
        QuantConfig().weights,
    )  # fmt: skip
    float_trial = TrialShard(Annotations({}, []), {})
    errors = []
    for executor in (InProcess(), RayExecutor()):
        with pytest.raises(ModelLoadError) as caught:
            list(executor.map(score_trial, trial_worker, context, [float_trial]))
        errors.append(str(caught.value))
    assert "cannot read the weights of 'w0'" in errors[0] and errors[1] == errors[0]


def test_the_cli_searches_on_the_cluster_with_the_same_output(cluster, tmp_path, calib_dir):
    model = conv_chain(layers=6)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    folder = calib_dir(model, n=16)
    outs = [tmp_path / "single.onnx", tmp_path / "ray.onnx"]
    common = [str(path), "--calib", str(folder), "-q", "--target", "cosine=0.99999"]
    assert main(["quantize", *common, "-o", str(outs[0])]) == 0
    address = cluster.get_runtime_context().gcs_address
    assert main(["quantize", *common, "-o", str(outs[1]), "--ray", address]) == 0
    assert outs[1].read_bytes() == outs[0].read_bytes()


def _sleeping_metric(reference: Any, quantized: Any) -> float:
    time.sleep(120)
    return 1.0


def _count_task(state: object, shard: int) -> int:
    return shard


def _setup(context: object) -> object:
    return context


def test_ctrl_c_during_the_trials_cancels_the_running_ones(cluster, monkeypatch):
    placed = []
    real = onnxq.mixed.sensitivity.Trials.placement

    def placement(self: Any, kept: Any) -> Any:
        placed.append(kept)
        if len(placed) == 4:  # three trials sent, the driver places a fourth: Ctrl-C
            raise KeyboardInterrupt
        return real(self, kept)

    monkeypatch.setattr(onnxq.mixed.sensitivity.Trials, "placement", placement)
    target = AccuracyTarget(_sleeping_metric, 0.5, name="slow")
    with pytest.raises(KeyboardInterrupt):
        searched(conv_chain(), target, executor=RayExecutor())
    # both CPUs would sleep for two minutes; cancelled, they take a new task at once
    began = time.monotonic()
    assert list(RayExecutor().map(_count_task, _setup, "other", range(2))) == [0, 1]
    assert time.monotonic() - began < 60
