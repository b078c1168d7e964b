"""The two exporters behind :func:`onnxq.pytorch.export.export_module`: ``torch.onnx.export``
run as TorchScript or dynamo, and the dynamo export's nodes renamed to TorchScript's scope
names."""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path
from typing import Any

import onnx

from onnxq.config.scopes import scope_name
from onnxq.errors import ConfigError, UnsupportedModelError
from onnxq.pytorch.compat import given_inputs_only


def run_exporter(
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
    """Write ``module`` to ``path`` with ``torch.onnx.export``; a failure says what to try."""
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


def scope_node_names(model: onnx.ModelProto) -> None:
    """Rename dynamo-exported nodes to TorchScript-style scope names (``/a/a.0/conv/Conv``)."""
    seen: dict[str, int] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = re.findall(r"'([^']*)'", meta.get("pkg.torch.onnx.name_scopes", ""))[1:-1]
        base = "/" + "".join(f"{scope_name(s.split('.'))}/" for s in scopes) + node.op_type
        count = seen.get(base, 0)
        seen[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"
