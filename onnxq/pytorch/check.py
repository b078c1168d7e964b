"""The export check: the exported model runs in onnxruntime and gives the module's outputs on
the example inputs, and again at twice their batch size where it declares a dynamic batch
axis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxq.errors import UnsupportedModelError
from onnxq.pytorch.batch_axis import batch_axis_refusal, doubled_batch
from onnxq.pytorch.signature import flatten_outputs


def check_export(
    path: Path,
    feeds: dict[str, np.ndarray],
    reference: list[tuple[str, Any]],
    rtol: float,
    atol: float,
) -> None:
    """Run the exported model in onnxruntime and compare each output with the module's."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a failing run is reported in the error, not logged
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        got = session.run(
            [n for n, _ in reference], {k: v for k, v in feeds.items() if k in wanted}
        )
    except Exception as exc:
        raise UnsupportedModelError(
            f"the exported ONNX model does not run in onnxruntime: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        ) from exc
    for (name, tensor), value in zip(reference, got, strict=True):
        expected = tensor.detach().cpu().numpy()
        if expected.shape != np.shape(value):
            ok, diff, limit = False, f"shape {list(np.shape(value))}", f"{list(expected.shape)}"
        elif expected.dtype.kind not in "fc":
            ok, diff, limit = bool(np.array_equal(expected, value)), "values differ", "equal"
        else:
            err = float(np.max(np.abs(expected - value), initial=0.0))
            bound = atol + rtol * float(np.max(np.abs(expected), initial=0.0))
            ok, diff, limit = err <= bound, f"max abs diff {err:.3g}", f"{bound:.3g}"
        if not ok:
            raise UnsupportedModelError(
                f"the exported ONNX model differs from the module on the example inputs: output "
                f"{name!r} {diff} (allowed {limit}); look for data-dependent control flow or "
                "ops the exporter traces as constants, or try the other exporter"
            )


def check_batch_axis(
    torch: Any,
    module: Any,
    model: onnx.ModelProto,
    path: Path,
    ins: list[str],
    outs: list[str],
    args: tuple[Any, ...],
    rtol: float,
    atol: float,
) -> None:
    """Run the export check again at twice the example's batch size where the model declares
    a dynamic batch axis (:mod:`onnxq.pytorch.batch_axis`)."""
    doubled = doubled_batch(torch, model, ins, args)
    if doubled is None:
        return
    try:
        reference = flatten_outputs(module(*doubled), "output")
    except Exception:  # the module itself takes no other batch size: nothing to compare
        return
    feeds = {n: t.detach().cpu().numpy() for n, t in zip(ins, doubled, strict=True)}
    try:
        check_export(
            path, feeds, [(n, t) for n, (_, t) in zip(outs, reference, strict=True)], rtol, atol
        )
    except UnsupportedModelError as exc:
        raise batch_axis_refusal(model, ins, doubled, exc) from exc
