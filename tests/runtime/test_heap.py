from __future__ import annotations

import sys

import pytest

from onnxq.runtime import heap


def test_free_memory_goes_back_through_the_c_librarys_trim(monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []
    monkeypatch.setattr(heap, "trim_function", lambda: lambda pad: calls.append(pad) or 1)
    assert heap.release_free_memory() is True
    assert calls == [0]  # no padding kept at the top of the heap


def test_without_a_trim_call_nothing_is_done(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(heap, "trim_function", lambda: None)
    assert heap.release_free_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibc_has_malloc_trim_and_it_runs():
    trim = heap.trim_function()
    assert trim is not None
    assert trim(0) in (0, 1)  # 1: memory was released, 0: there was none to release
