"""Calibration on a real local Ray cluster (two raylets on this machine, one CPU each).

The cluster tests are skipped where the ``ray`` package is not installed (``pip install
'onnxq[ray]'``; CI installs it); the tests of what happens without Ray run everywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.cli import main
from onnxq.errors import CalibrationDataError, InternalError, ResourceError
from onnxq.scale import RayExecutor
from onnxq.scale import ray_executor as ray_module
from tests import control_flow_graphs as cf
from tests import graphs
from tests.scale.ray_cluster import local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two raylets of one CPU each, and this process connected to them."""
    with local_cluster(sys.modules[__name__]) as ray:
        yield ray


def quantized_bytes(model: onnx.ModelProto, data: object, **options: object) -> bytes:
    result = onnxq.quantize(model, data, progress=False, fidelity_batches=2, **options)
    return result.model.SerializeToString()


@pytest.mark.parametrize("shard", [1, 3])
def test_ray_gives_the_bytes_of_one_process_for_a_folder_and_for_batches(cluster, calib_dir, shard):
    model = graphs.residual_add()
    folder = calib_dir(model, n=7)
    executor = RayExecutor(shard_batches=shard)
    assert executor.parallelism == 2
    for method in ("entropy", "ema"):
        single = quantized_bytes(model, folder, method=method)
        assert quantized_bytes(model, folder, method=method, executor=executor) == single
    nested = cf.nested_if()
    batches = cf.batches(nested, 7, outer=lambda k: k % 3 == 0, inner=True)
    assert quantized_bytes(nested, batches, executor=executor) == quantized_bytes(nested, batches)


def _counting_setup(context: object) -> list[int]:
    return [0]


def _count_task(state: list[int], shard: int) -> tuple[int, int]:
    state[0] += 1
    time.sleep(0.05)
    return os.getpid(), state[0]


def test_the_context_is_set_up_once_per_worker(cluster):
    results = list(RayExecutor().map(_count_task, _counting_setup, "model", range(12)))
    by_worker: dict[int, list[int]] = {}
    for pid, count in results:
        by_worker.setdefault(pid, []).append(count)
    # every worker counts its shards on one state: set up once, not per task
    assert sorted(n for counts in by_worker.values() for n in counts) != [1] * 12
    for counts in by_worker.values():
        assert sorted(counts) == list(range(1, len(counts) + 1))


class _DyingOnce:
    """Batches whose window holding batch ``victim`` kills the worker that first reads it
    (SIGKILL: no Python cleanup), marked in ``marker`` so that Ray's retry reads it whole.
    Only windows (what workers read) are armed: the driver reads the whole source."""

    def __init__(self, batches: list[dict[str, np.ndarray]], marker: Path, victim: int) -> None:
        self.batches, self.marker, self.victim = batches, marker, victim
        self.start: int | None = None  # a window's first batch; None: the whole source

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        start = self.start
        here = start is not None and start <= self.victim < start + len(self.batches)
        if here and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return iter(self.batches)

    def window(self, start: int, stop: int) -> _DyingOnce:
        part = _DyingOnce(self.batches[start:stop], self.marker, self.victim)
        part.start = start
        return part


def test_a_worker_killed_mid_task_is_retried_and_the_bytes_are_the_same(cluster, tmp_path):
    model = graphs.residual_add()
    batches = graphs.random_batches(model, 8)
    single = quantized_bytes(model, batches, method="entropy")
    source = _DyingOnce(batches, tmp_path / "killed", victim=5)
    sharded = quantized_bytes(
        model, source, method="entropy", executor=RayExecutor(shard_batches=2)
    )
    assert (tmp_path / "killed").exists()  # a worker did die
    assert sharded == single


def test_a_bad_file_gives_the_error_of_one_process(cluster, calib_dir):
    model = graphs.conv_relu()
    folder = calib_dir(model, n=6)
    (folder / "0004.npz").write_bytes(b"not a zip file")
    errors = []
    for executor in (None, RayExecutor(shard_batches=2)):
        with pytest.raises(CalibrationDataError) as caught:
            quantized_bytes(model, folder, executor=executor)
        errors.append(str(caught.value))
    assert "0004.npz" in errors[0]
    assert errors[1] == errors[0]


def _failing_task(state: object, shard: int) -> int:
    raise ValueError(f"shard {shard} broke")


def test_an_unexpected_failure_on_a_worker_is_an_internal_error(cluster):
    with pytest.raises(InternalError, match="ValueError: shard 0 broke"):
        list(RayExecutor().map(_failing_task, _counting_setup, "model", range(3)))


def test_a_worker_with_other_versions_refuses_its_shard(cluster, monkeypatch):
    monkeypatch.setattr(ray_module, "_versions", lambda: ("0.0", "1.0"))  # this driver's
    with pytest.raises(ResourceError, match="install the same versions on every node"):
        list(RayExecutor().map(_count_task, _counting_setup, "model", range(2)))


def _sleeping_task(state: object, shard: int) -> int:
    if shard > 0:
        time.sleep(120)
    return shard


@pytest.mark.parametrize("stop", ["close", "interrupt"])
def test_stopping_early_cancels_the_tasks_still_running(cluster, stop):
    executor = RayExecutor()

    def shards() -> Iterator[int]:
        yield from range(4)
        if stop == "interrupt":
            raise KeyboardInterrupt  # Ctrl-C while the driver reads more data

    results = executor.map(_sleeping_task, _counting_setup, "model", shards())
    if stop == "close":
        assert next(results) == 0
        results.close()
    else:
        with pytest.raises(KeyboardInterrupt):
            list(results)
    # both CPUs would sleep for two minutes; cancelled, they take a new task at once
    began = time.monotonic()
    assert list(executor.map(_count_task, _counting_setup, "other", range(2)))
    assert time.monotonic() - began < 60


def test_the_cli_runs_on_the_cluster_with_the_same_output(cluster, tmp_path, calib_dir):
    model = graphs.residual_add()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    folder = calib_dir(model, n=5)
    outs = [tmp_path / "single.onnx", tmp_path / "ray.onnx"]
    common = [str(path), "--calib", str(folder), "-q"]
    assert main(["quantize", *common, "-o", str(outs[0])]) == 0
    # (this process is connected already: the executor uses that connection)
    address = cluster.get_runtime_context().gcs_address
    assert main(["quantize", *common, "-o", str(outs[1]), "--ray", address]) == 0
    assert outs[1].read_bytes() == outs[0].read_bytes()


# ------------------------------------------------------------------------- without a cluster
def test_without_the_ray_package_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ResourceError, match=r"pip install 'onnxq\[ray\]'"):
        _ = RayExecutor().parallelism


def test_without_ray_the_cli_prints_one_line_and_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    model = graphs.conv_relu()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    calib = tmp_path / "calib"
    calib.mkdir()
    np.savez(calib / "0000.npz", **graphs.random_inputs(model))
    out = tmp_path / "out.onnx"
    args = [str(path), "-o", str(out), "--calib", str(calib), "-q", "--ray", "auto"]
    assert main(["quantize", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'onnxq[ray]'" in err[0]
    assert not out.exists()


class _Unreachable:
    """A stand-in for the ray module whose cluster cannot be reached."""

    @staticmethod
    def is_initialized() -> bool:
        return False

    @staticmethod
    def init(**options: object) -> None:
        raise ConnectionError("Could not find any running Ray instance")


@pytest.mark.parametrize(
    ("address", "hint"), [("auto", "ray start --head"), ("10.0.0.9:6379", "check the address")]
)
def test_a_cluster_that_cannot_be_reached_is_a_resource_error(monkeypatch, address, hint):
    monkeypatch.setitem(sys.modules, "ray", _Unreachable)
    with pytest.raises(ResourceError, match=f"cannot connect to the Ray cluster at {address}"):
        try:
            _ = RayExecutor(address).parallelism
        except ResourceError as exc:
            assert hint in str(exc)
            raise


def test_onnxq_imports_and_shards_without_the_ray_package():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import onnxq, onnxq.scale\n"
        "from tests import graphs\n"
        "m = graphs.conv_relu(); b = graphs.random_batches(m, 3)\n"
        "one = onnxq.quantize(m, b, progress=False).model.SerializeToString()\n"
        "two = onnxq.quantize(m, b, progress=False, executor=onnxq.scale.InProcess(1))\n"
        "assert two.model.SerializeToString() == one\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
