"""The one progress bar of onnxq's long steps: tqdm on stderr, cleared when done, and none when
stderr is not a terminal (logs then stay one line per message)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def bar(
    label: str, total: int | None = None, unit: str = "batch", items: Iterable[Any] | None = None
) -> Any:
    """A bar over ``items``, or one to ``update`` by hand (``with bar(...) as b: b.update(n)``)."""
    from tqdm import tqdm

    return tqdm(
        items,
        desc=label,
        total=total,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=None,
    )


def counted(
    items: Iterable[T],
    label: str,
    enabled: bool = True,
    total: int | None = None,
    unit: str = "batch",
) -> Iterator[T]:
    """``items``, counted by a bar labelled ``label`` when ``enabled``."""
    return iter(bar(label, total, unit, items)) if enabled else iter(items)
