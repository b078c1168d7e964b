"""PyTorch front door: export an ``nn.Module`` to ONNX, check the export, quantize it.

Exporter: ``torchscript`` (``torch.onnx.export(dynamo=False)``, opset 17) by default: on torch
2.13 it is the stable, compact path and names nodes after the module hierarchy.  ``dynamo``
(``torch.export``, needs ``onnxscript``) builds opset 18; its nodes are renamed to the same
scope names, so :func:`module_pattern` works for both.  The export goes to a temporary folder
that is always removed.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxq.api import QuantizedModel, quantize
from onnxq.config.scopes import module_pattern, scope_name
from onnxq.errors import CalibrationDataError, ConfigError, UnsupportedModelError
from onnxq.pytorch.batch_axis import batch_axis_refusal, doubled_batch
from onnxq.pytorch.compat import given_inputs_only, non_tensor_hint

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
    """Export ``module`` to ONNX, check the export, and quantize it with :func:`onnxq.quantize`.

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

    Returns:
        The :class:`onnxq.QuantizedModel` that :func:`onnxq.quantize` returns.
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
    if exporter not in EXPORTERS:
        raise ConfigError(f"exporter: unknown exporter {exporter!r}; valid: {', '.join(EXPORTERS)}")
    if dynamic_shapes is not None and exporter != "dynamo":
        raise ConfigError(
            "dynamic_shapes is for exporter='dynamo'; the torchscript exporter "
            "takes dynamic_axes={name: {axis: label}}"
        )
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    args = _as_args(torch, example_inputs)
    opset = DEFAULT_OPSET[exporter] if opset is None else opset
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            reference = _flatten(_call(module, args), "output")
            ins = list(input_names) if input_names is not None else _forward_names(module, args)
            outs = list(output_names) if output_names is not None else [n for n, _ in reference]
            for kind, names, want in (("input", ins, len(args)), ("output", outs, len(reference))):
                if len(names) != want or len(set(names)) != want:
                    raise ConfigError(f"{kind}_names: expected {want} distinct names, got {names}")
            if dynamic_axes is None:
                tensors = [
                    *zip(ins, args, strict=True),
                    *zip(outs, [t for _, t in reference], strict=True),
                ]
                dynamic_axes = {n: {0: "batch"} for n, t in tensors if t.dim() >= 1}
            with tempfile.TemporaryDirectory(prefix="onnxq-export-") as folder:
                path = Path(folder) / "model.onnx"
                _export(
                    torch,
                    module,
                    args,
                    path,
                    ins,
                    outs,
                    dict(dynamic_axes),
                    dynamic_shapes,
                    opset,
                    exporter,
                )
                model = onnx.load(str(path))
                if exporter == "dynamo":
                    _scope_node_names(model)
                feeds = {n: t.detach().cpu().numpy() for n, t in zip(ins, args, strict=True)}
                _check_export(
                    path,
                    feeds,
                    [(n, t) for n, (_, t) in zip(outs, reference, strict=True)],
                    rtol,
                    atol,
                )
                _check_batch_axis(torch, module, model, path, ins, outs, args, rtol, atol)
    finally:
        module.train(was_training)
    return model, ins


def _call(module: Any, args: tuple[Any, ...]) -> Any:
    """The module's outputs on the example inputs; a failing call names forward's parameters."""
    try:
        return module(*args)
    except Exception as exc:
        params = ", ".join(_positional_params(module)[: len(args) + 2]) + ", ..."
        raise ConfigError(
            f"calling {type(module).__name__} on example_inputs failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}; example_inputs are passed "
            f"positionally to forward({params}), in that order"
        ) from exc


def _check_batch_axis(
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
        reference = _flatten(module(*doubled), "output")
    except Exception:  # the module itself takes no other batch size: nothing to compare
        return
    feeds = {n: t.detach().cpu().numpy() for n, t in zip(ins, doubled, strict=True)}
    try:
        _check_export(
            path, feeds, [(n, t) for n, (_, t) in zip(outs, reference, strict=True)], rtol, atol
        )
    except UnsupportedModelError as exc:
        raise batch_axis_refusal(model, ins, doubled, exc) from exc


def _as_args(torch: Any, example_inputs: Any) -> tuple[Any, ...]:
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    args = tuple(torch.from_numpy(t) if isinstance(t, np.ndarray) else t for t in items)
    for i, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            raise ConfigError(
                f"example_inputs[{i}]: expected a tensor or a numpy array, got {type(arg).__name__}"
            )
    return args


def _positional_params(module: Any) -> list[str]:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _forward_names(module: Any, args: tuple[Any, ...]) -> list[str]:
    named = _positional_params(module)
    if len(named) >= len(args):
        return named[: len(args)]
    return ["input"] if len(args) == 1 else [f"input_{i}" for i in range(len(args))]


def _flatten(value: Any, name: str) -> list[tuple[str, Any]]:
    """Output tensors in the exporter's order, named by dict key / position."""
    if isinstance(value, Mapping):
        return [
            pair
            for k, v in value.items()
            for pair in _flatten(v, str(k) if name == "output" else f"{name}.{k}")
        ]
    if isinstance(value, (tuple, list)):
        return [pair for i, v in enumerate(value) for pair in _flatten(v, f"{name}_{i}")]
    if value is None or not hasattr(value, "detach"):
        raise UnsupportedModelError(
            f"module output {name!r} is a {type(value).__name__}, not a tensor; "
            f"{non_tensor_hint(value)}"
        )
    return [(name, value)]


def _export(
    torch: Any,
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    ins: list[str],
    outs: list[str],
    dynamic_axes: dict[str, Any],
    dynamic_shapes: Any,
    opset: int,
    exporter: str,
) -> None:
    kwargs: dict[str, Any] = dict(
        opset_version=opset, input_names=ins, output_names=outs, dynamo=exporter == "dynamo"
    )
    if exporter == "dynamo":
        if dynamic_shapes is not None:
            kwargs["dynamic_shapes"] = dynamic_shapes
        elif dynamic_axes:
            kwargs["dynamic_axes"] = dynamic_axes
        kwargs.update(external_data=True, verbose=False)
    else:
        kwargs["dynamic_axes"] = dynamic_axes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript deprecation notice, tracer hints
            with contextlib.ExitStack() as stack:
                if exporter == "torchscript":
                    stack.enter_context(given_inputs_only(module))
                torch.onnx.export(module, args, str(path), **kwargs)
    except ImportError as exc:
        raise ConfigError(
            f"exporter={exporter!r} needs a package that is missing ({exc}); "
            "pip install onnxscript, or use exporter='torchscript'"
        ) from None
    except Exception as exc:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # dynamo colours its messages
        lines = [ln.strip() for ln in text.split("## Exception summary")[-1].splitlines()]
        first = next((ln for ln in lines if ln), "")[:300]
        other = "dynamo" if exporter == "torchscript" else "torchscript"
        raise UnsupportedModelError(
            f"torch.onnx.export ({exporter} exporter, opset {opset}) failed: "
            f"{type(exc).__name__}: {first}; try exporter={other!r} or another opset"
        ) from exc


def _scope_node_names(model: onnx.ModelProto) -> None:
    """Rename dynamo-exported nodes to TorchScript-style scope names (``/a/a.0/conv/Conv``)."""
    seen: dict[str, int] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = re.findall(r"'([^']*)'", meta.get("pkg.torch.onnx.name_scopes", ""))[1:-1]
        base = "/" + "".join(f"{scope_name(s.split('.'))}/" for s in scopes) + node.op_type
        count = seen.get(base, 0)
        seen[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"


def _check_export(
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


__all__ = ["EXPORTERS", "export_module", "module_pattern", "quantize_torch", "torch_batches"]
