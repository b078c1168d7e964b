"""What a quantized model records about its quantized tensors: :class:`Placed` (what
``materialize`` returns for each) and the model metadata built from them (each tensor's bits,
element type, method and scheme; the CPU class an onnxruntime output was tuned for), which
``onnxq inspect`` and ``onnxq check`` read back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from onnxq.numerics.qparams import QParams


@dataclass(frozen=True)
class Placed:
    """One tensor that received Q/DQ: its kind and qparams, its bits and element type
    (``runtime``: a dynamic kernel computes its qparams on each run)."""

    tensor: str
    kind: str
    qparams: QParams
    consumers: tuple[tuple[str, int], ...]
    bits: int = 8
    dtype: str = "int8"
    runtime: bool = False


METADATA_KEY = "onnxq.quantization"


def write_metadata(
    model: onnx.ModelProto, placed: list[Placed], target_cpu: str | None = None
) -> None:
    """Record each quantized tensor's bit width, element type, method and scheme in
    ``metadata_props``.

    The value under :data:`METADATA_KEY` is JSON: ``{"version": ..., "tensors": {name: {"kind",
    "bits", "dtype", "method", "axis", "symmetric"}}}`` (Sparsebit's "extra bit info", as model
    metadata so that every ONNX tool keeps it), with ``"target_cpu"``, the CPU class the
    output was tuned for, when the backend's output depends on it.  ``dtype`` is the element
    type (``int8``, ``uint16``, ``float8e4m3fn``, ...); an activation that a dynamic kernel
    quantizes at run time has ``"runtime": true`` and the type the kernel quantizes it to.
    """
    import json

    from onnxq.version import __version__

    tensors = {
        p.tensor: {
            "kind": p.kind,
            "bits": p.bits,
            "dtype": p.dtype,
            "method": p.qparams.method,
            "axis": p.qparams.axis,
            # a weight's zero point is 0, or 128 in uint8 storage: symmetric either way
            "symmetric": not p.runtime
            and (
                p.kind == "weight"
                or bool(np.all(np.asarray(p.qparams.zero_point, dtype=np.float64) == 0))
            ),
            **({"runtime": True} if p.runtime else {}),
        }
        for p in placed
    }
    record: dict[str, object] = {"version": __version__, "tensors": tensors}
    if target_cpu is not None:
        record["target_cpu"] = target_cpu
    value = json.dumps(record, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=METADATA_KEY, value=value)


def read_target_cpu(model: onnx.ModelProto) -> str | None:
    """The CPU class recorded by :func:`write_metadata` (``None`` if none was)."""
    import json

    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                value = json.loads(prop.value).get("target_cpu")
            except (ValueError, AttributeError):
                return None
            return value if isinstance(value, str) else None
    return None


def read_metadata(model: onnx.ModelProto) -> dict[str, dict[str, object]] | None:
    """The per-tensor records written by :func:`write_metadata` (``None`` if absent)."""
    import json

    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                return dict(json.loads(prop.value).get("tensors", {}))
            except (ValueError, AttributeError):
                return None
    return None
