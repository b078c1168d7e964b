"""Scratch folders that a signal cannot leave behind.

onnxq writes a model into a temporary folder where onnxruntime must read it from a file (large
weights, external data).  The CLI turns SIGINT and SIGTERM into ``KeyboardInterrupt`` through
:func:`interrupt`; one that lands while such a folder is being created or removed waits until
that step is over (:func:`uninterrupted`), so an interrupted run leaves no folder behind.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

_state = {"depth": 0, "pending": False}


def interrupt(signum: int, frame: object) -> None:
    """Signal handler: ``KeyboardInterrupt`` now, or when the step that holds it off ends."""
    if _state["depth"]:
        _state["pending"] = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold off :func:`interrupt` inside the block; a signal that came meanwhile raises at its
    end."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if not _state["depth"] and _state["pending"]:
            _state["pending"] = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def scratch_dir(prefix: str = "onnxq-") -> Iterator[Path]:
    """A temporary folder, removed on the way out, whatever ends the block."""
    path: str | None = None
    try:
        with uninterrupted():
            path = tempfile.mkdtemp(prefix=prefix)
        yield Path(path)
    finally:
        if path is not None:
            with uninterrupted():
                shutil.rmtree(path, ignore_errors=True)
