"""PyTorch front door: export an ``nn.Module`` to ONNX, check the export, quantize it.

Exporter: ``torchscript`` (``torch.onnx.export(dynamo=False)``, opset 17) by default: on torch
2.13 it is the stable, compact path and names nodes after the module hierarchy.  ``dynamo``
(``torch.export``, needs ``onnxscript``) builds opset 18; its nodes are renamed to the same
scope names, so :func:`module_pattern` works for both.  The export goes to a temporary folder
that is always removed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from onnxq.api import QuantizedModel, quantize
from onnxq.config.scopes import module_pattern
from onnxq.errors import ConfigError
from onnxq.pytorch.batches import torch_batches
from onnxq.pytorch.check import check_batch_axis, check_export
from onnxq.pytorch.exporters import run_exporter, scope_node_names
from onnxq.pytorch.signature import as_args, call_module, flatten_outputs, forward_names

INSTALL_HINT = "pip install 'onnxq[torch]'"
EXPORTERS = ("torchscript", "dynamo")
DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            f"quantize_torch needs PyTorch, which is not installed: {INSTALL_HINT} "
            "(pins the CPU-capable torch==2.13.0)"
        ) from None
    return torch


def quantize_torch(
    module: Any,
    example_inputs: Any,
    calibration: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    opset: int | None = None,
    exporter: str = "torchscript",
    calibration_fn: Callable[[Any], Any] | None = None,
    rtol: float = 1e-3,
    atol: float = 1e-5,
    **options: Any,
) -> QuantizedModel:
    """Export ``module`` to ONNX, check the export, and quantize it with :func:`onnxq.quantize`
    (its :class:`onnxq.QuantizedModel` is returned).

    The exported model is run in onnxruntime on ``example_inputs`` and compared with the
    module's outputs before anything is quantized.  Calibration items (a ``DataLoader`` or any
    iterable) are a dict ``{input_name: tensor}``; a tensor or array (single-input models); or
    a tuple/list whose first ``len(inputs)`` elements are the inputs in ``forward`` order, the
    rest (labels) ignored.  Tensors become numpy with ``detach().cpu().numpy()``.

    Args:
        module: a ``torch.nn.Module`` (exported in eval mode under ``torch.no_grad``; its
            training flag is restored afterwards).
        example_inputs: a tensor or a tuple/list of tensors, the positional ``forward`` args.
        calibration: a ``DataLoader``, an iterable of items (above), or anything
            :func:`onnxq.quantize` accepts (a folder of ``.npz`` batches, ...).
        input_names, output_names: ONNX names.  Defaults: the ``forward`` parameter names;
            the dict keys for a dict output (nested keys joined with ``.``), ``output`` for
            one tensor, ``output_0, output_1, ...`` for a tuple/list.
        dynamic_axes: TorchScript-style ``{name: {axis: label}}``; default: axis 0 of every
            input and output is ``batch``; ``{}`` exports static shapes.
        dynamic_shapes: ``torch.export`` dynamic shapes (``exporter="dynamo"`` only).
        opset: ONNX opset (default 17 for ``torchscript``, 18 for ``dynamo``).
        exporter: ``torchscript`` (``dynamo=False``) or ``dynamo``.
        calibration_fn: maps one calibration item to one of the forms above.
        rtol, atol: the export check fails when ``max|onnx - torch| > atol + rtol * max|torch|``
            for an output.
        **options: everything :func:`onnxq.quantize` takes (``backend``, ``method``,
            ``exclude``, ``config``, ``batch_size``, any QuantConfig field, ...).

    """
    model, names = export_module(
        module,
        example_inputs,
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=dynamic_axes,
        dynamic_shapes=dynamic_shapes,
        opset=opset,
        exporter=exporter,
        rtol=rtol,
        atol=atol,
    )
    return _quantize_export(module, model, names, calibration, calibration_fn, options)


def _quantize_export(
    module: Any,
    model: onnx.ModelProto,
    names: list[str],
    calibration: Any,
    calibration_fn: Callable[[Any], Any] | None,
    options: dict[str, Any],
) -> QuantizedModel:
    """Quantize the exported ``model`` on the torch ``calibration`` data (``names``: its inputs
    in ``forward`` order; those the exporter dropped are not fed)."""
    graph_inputs = [i.name for i in model.graph.input]
    data = torch_batches(
        calibration, [n for n in names if n in graph_inputs], calibration_fn, positional=names
    )
    result = quantize(model, data, **options)
    result.report.model = f"<torch module {type(module).__name__}>"
    return result


def export_module(
    module: Any,
    example_inputs: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    opset: int | None = None,
    exporter: str = "torchscript",
    rtol: float = 1e-3,
    atol: float = 1e-5,
) -> tuple[onnx.ModelProto, list[str]]:
    """Export and check ``module`` (see :func:`quantize_torch`); returns the float model and
    the input names in ``forward`` order."""
    torch = _import_torch()
    _check_request(torch, module, exporter, dynamic_shapes)
    args = as_args(torch, example_inputs)
    opset = DEFAULT_OPSET[exporter] if opset is None else opset
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            reference = flatten_outputs(call_module(module, args), "output")
            ins, outs = _io_names(module, args, reference, input_names, output_names)
            if dynamic_axes is None:
                dynamic_axes = _batch_axes(ins, args, outs, reference)
            with tempfile.TemporaryDirectory(prefix="onnxq-export-") as folder:
                path = Path(folder) / "model.onnx"
                axes = dict(dynamic_axes)
                run_exporter(
                    torch, module, args, path, ins, outs, axes, dynamic_shapes, opset, exporter
                )
                model = onnx.load(str(path))
                if exporter == "dynamo":
                    scope_node_names(model)
                feeds = {n: t.detach().cpu().numpy() for n, t in zip(ins, args, strict=True)}
                named = [(n, t) for n, (_, t) in zip(outs, reference, strict=True)]
                check_export(path, feeds, named, rtol, atol)
                check_batch_axis(torch, module, model, path, ins, outs, args, rtol, atol)
    finally:
        module.train(was_training)
    return model, ins


def _check_request(torch: Any, module: Any, exporter: str, dynamic_shapes: Any) -> None:
    """Refuse an unknown exporter, ``dynamic_shapes`` without dynamo, and a non-module."""
    if exporter not in EXPORTERS:
        raise ConfigError(f"exporter: unknown exporter {exporter!r}; valid: {', '.join(EXPORTERS)}")
    if dynamic_shapes is not None and exporter != "dynamo":
        raise ConfigError(
            "dynamic_shapes is for exporter='dynamo'; the torchscript exporter "
            "takes dynamic_axes={name: {axis: label}}"
        )
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"module must be a torch.nn.Module, got {type(module).__name__}")


def _io_names(
    module: Any,
    args: tuple[Any, ...],
    reference: list[tuple[str, Any]],
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
) -> tuple[list[str], list[str]]:
    """The ONNX input and output names: those given, else ``forward``'s parameters and the
    outputs' own names; one distinct name per tensor."""
    ins = list(input_names) if input_names is not None else forward_names(module, args)
    outs = list(output_names) if output_names is not None else [n for n, _ in reference]
    for kind, names, want in (("input", ins, len(args)), ("output", outs, len(reference))):
        if len(names) != want or len(set(names)) != want:
            raise ConfigError(f"{kind}_names: expected {want} distinct names, got {names}")
    return ins, outs


def _batch_axes(
    ins: list[str], args: tuple[Any, ...], outs: list[str], reference: list[tuple[str, Any]]
) -> dict[str, Any]:
    """The default dynamic axes: axis 0 of every input and output of rank >= 1 is ``batch``."""
    tensors = [*zip(ins, args, strict=True), *zip(outs, [t for _, t in reference], strict=True)]
    return {n: {0: "batch"} for n, t in tensors if t.dim() >= 1}


__all__ = ["EXPORTERS", "export_module", "module_pattern", "quantize_torch", "torch_batches"]
