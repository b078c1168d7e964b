"""Scratch folders: removed however the block ends, also when a signal lands mid-removal."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from onnxq.ir import scratch
from onnxq.ir.scratch import interrupt, scratch_dir, uninterrupted


def test_the_folder_is_removed_after_the_block_and_after_an_error():
    with scratch_dir() as path:
        (path / "model.onnx").write_bytes(b"x")
        assert path.name.startswith("onnxq-")
    assert not path.exists()
    with pytest.raises(ValueError), scratch_dir("onnxq-test-") as failed:
        raise ValueError
    assert not failed.exists()


def test_an_interrupt_inside_an_uninterrupted_step_raises_when_the_step_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt), uninterrupted():
        interrupt(signal.SIGTERM, None)
        reached.append("after the signal")  # the step went on
    assert reached == ["after the signal"]
    with pytest.raises(KeyboardInterrupt):
        interrupt(signal.SIGTERM, None)  # outside a step: at once


def test_a_signal_during_the_removal_still_removes_the_folder(monkeypatch):
    real = shutil.rmtree
    seen: list[Path] = []

    def signalled_rmtree(path, ignore_errors=False):
        interrupt(signal.SIGTERM, None)  # as if SIGTERM arrived in the middle of the removal
        seen.append(Path(path))
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(scratch.shutil, "rmtree", signalled_rmtree)
    with pytest.raises(KeyboardInterrupt), scratch_dir() as path:
        (path / "weights.bin").write_bytes(b"w")
    assert seen == [path] and not path.exists()
