"""Check that an exported model's dynamic batch axis is really dynamic.

An exporter may declare the batch axis of an input dynamic while it fixes the example's batch
size inside the graph: ``torch.onnx.export(dynamo=True)`` with ``dynamic_axes`` specialises it
silently where the module reshapes by the batch size (HF Swin's window partition, SegFormer's
sequence reduction), and the TorchScript tracer records ``int(x.shape[0])`` as a constant.
Such a model passes the check on the example inputs and then fails, or gives wrong shapes, on
the first calibration batch of another size.  :func:`doubled_batch` builds inputs of twice the
example's batch size to run the export check on again; :func:`batch_axis_refusal` words the
refusal when that check fails.
"""

from __future__ import annotations

from typing import Any

import onnx

from onnxq.errors import UnsupportedModelError


def dynamic_batch_inputs(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """The inputs among ``names`` whose leading axis the model declares symbolic or unknown."""
    found = []
    for value in model.graph.input:
        if value.name not in names or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            found.append(value.name)
    return found


def doubled_batch(
    torch: Any, model: onnx.ModelProto, names: list[str], args: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    """``args`` with every dynamic-batch input repeated twice along axis 0, or None when the
    model has no dynamic batch input."""
    dynamic = set(dynamic_batch_inputs(model, names))
    if not dynamic:
        return None
    return tuple(
        torch.cat([arg, arg]) if name in dynamic and arg.dim() >= 1 else arg
        for name, arg in zip(names, args, strict=True)
    )


def batch_axis_refusal(
    model: onnx.ModelProto, names: list[str], doubled: tuple[Any, ...], exc: UnsupportedModelError
) -> UnsupportedModelError:
    """The error for an export whose declared dynamic batch axis does not take the batch size
    of ``doubled`` (from :func:`doubled_batch`)."""
    dynamic = dynamic_batch_inputs(model, names)
    inputs = ", ".join(repr(n) for n in dynamic)
    batch = next(int(a.shape[0]) for n, a in zip(names, doubled, strict=True) if n in dynamic)
    detail = str(exc).split(": ", 1)[-1] if "onnxruntime" in str(exc) else str(exc)
    return UnsupportedModelError(
        f"the exported ONNX model declares the batch axis of {inputs} dynamic but does not "
        f"give the module's result at batch size {batch} ({detail[:300]}): the exporter fixed "
        "the example's batch size inside the graph; export static shapes with "
        "dynamic_axes={} and example inputs of the calibration batch size, or try the other "
        "exporter"
    )


__all__ = ["batch_axis_refusal", "doubled_batch", "dynamic_batch_inputs"]
