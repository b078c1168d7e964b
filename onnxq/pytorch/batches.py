"""Torch calibration data as onnxq batches ``{input_name: np.ndarray}``: a DataLoader, an
iterable of tensors, tuples or dicts, or a path passed through."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from onnxq.errors import CalibrationDataError


class _TorchBatches:
    """Re-iterable view of a re-iterable source (a DataLoader), converting each item."""

    def __init__(self, source: Iterable[Any], convert: Callable[[Any, int], dict[str, Any]]):
        self.source, self.convert = source, convert

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i, item in enumerate(self.source):
            yield self.convert(item, i)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]  # TypeError: length unknown


def torch_batches(
    calibration: Any,
    input_names: Sequence[str],
    calibration_fn: Callable[[Any], Any] | None = None,
    positional: Sequence[str] | None = None,
) -> Any:
    """Turn torch calibration data into onnxq batches ``{input_name: np.ndarray}``.

    Paths are passed through unchanged.  ``positional`` (default ``input_names``) is the order
    in which tuple/list items supply inputs; names missing from ``input_names`` (inputs the
    exporter dropped as unused) are skipped.
    """
    if isinstance(calibration, (str, os.PathLike)):
        return calibration
    order = list(positional if positional is not None else input_names)
    keep = set(input_names)

    def convert(item: Any, index: int) -> dict[str, Any]:
        if calibration_fn is not None:
            item = calibration_fn(item)
        if isinstance(item, Mapping):  # inputs the exporter dropped as unused are skipped
            return {str(k): _to_numpy(v) for k, v in item.items() if k in keep or k not in order}
        if isinstance(item, (tuple, list)):
            if len(item) < len(order):
                raise CalibrationDataError(
                    f"calibration batch {index}: a {type(item).__name__} of {len(item)} items, the "
                    f"model has {len(order)} inputs {order}; pass calibration_fn="
                )
            pairs = zip(order, item[: len(order)], strict=True)
        elif len(order) == 1:
            pairs = zip(order, [item], strict=True)
        else:
            raise CalibrationDataError(
                f"calibration batch {index}: one {type(item).__name__} for a model with "
                f"{len(order)} inputs {order}; yield tuples or dicts, or pass calibration_fn="
            )
        return {n: _to_numpy(v) for n, v in pairs if n in keep}

    if isinstance(calibration, Mapping):
        return [convert(calibration, 0)]
    if not isinstance(calibration, Iterable):
        raise CalibrationDataError(
            f"calibration of type {type(calibration).__name__} is not "
            "supported; give a DataLoader or an iterable of tensors"
        )
    if isinstance(calibration, Iterator):  # one pass only (a generator): keep it one pass
        return (convert(item, i) for i, item in enumerate(calibration))
    return _TorchBatches(calibration, convert)


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)
