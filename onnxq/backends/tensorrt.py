"""Build a TensorRT engine from a Q/DQ model and report each layer's precision.

Needs the ``tensorrt`` package (``pip install 'onnxq[tensorrt]'``) and a CUDA GPU; it is imported
only when called.  Everywhere else the static checker (:mod:`onnxq.backends.check`) is the guard.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from onnxq.errors import BackendConstraintError, ConfigError, Violation


@dataclass(frozen=True)
class EngineReport:
    """Per-layer output precision of a built engine."""

    layers: tuple[tuple[str, str, str], ...]  # (layer name, layer type, output precision)
    precisions: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: how many layers run in which precision."""
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(self.precisions.items()))
        return f"TensorRT engine: {len(self.layers)} layers ({parts})"


def tensorrt_available() -> str | None:
    """``None`` if an engine can be built here, else the reason it cannot."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "the tensorrt package is not installed (pip install 'onnxq[tensorrt]')"
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1): TensorRT needs an NVIDIA GPU"
    return None


def build_engine(
    model_path: str | Path,
    shapes: dict[str, tuple[int, ...]] | None = None,
    workspace_mb: int = 2048,
) -> EngineReport:
    """Parse ``model_path`` with TensorRT's ONNX parser, build an INT8 engine, inspect it.

    ``shapes`` fixes dynamic input dimensions (used as min = opt = max of one profile).
    """
    reason = tensorrt_available()
    if reason:
        raise ConfigError(f"cannot build a TensorRT engine (--engine): {reason}")
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        violations = [
            Violation(str(e.node_name() or e.node()), "parse", "TensorRT accepts it", e.desc())
            for e in errors
        ]
        raise BackendConstraintError(
            f"TensorRT's ONNX parser rejects {model_path}: "
            f"{violations[0].got if violations else 'no detail'}",
            violations,
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb * 2**20)
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_flag(trt.BuilderFlag.FP16)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    _add_profile(builder, network, config, shapes or {})
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendConstraintError(f"TensorRT failed to build an engine from {model_path}")
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    info = json.loads(
        engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    )
    layers = []
    for layer in info.get("Layers", []):
        if not isinstance(layer, dict):
            continue
        outputs = layer.get("Outputs") or [{}]
        fmt = str(outputs[0].get("Format/Datatype", "unknown"))
        precision = (
            "INT8"
            if "Int8" in fmt
            else "FP16"
            if "Half" in fmt
            else "FP32"
            if "Float" in fmt
            else fmt
        )
        layers.append((str(layer.get("Name", "")), str(layer.get("LayerType", "")), precision))
    return EngineReport(tuple(layers), dict(Counter(p for _, _, p in layers)))


def _add_profile(
    builder: object, network: object, config: object, shapes: dict[str, tuple[int, ...]]
) -> None:
    dynamic = []
    for i in range(network.num_inputs):  # type: ignore[attr-defined]
        tensor = network.get_input(i)  # type: ignore[attr-defined]
        if any(d < 0 for d in tensor.shape):
            dynamic.append(tensor)
    if not dynamic:
        return
    profile = builder.create_optimization_profile()  # type: ignore[attr-defined]
    for tensor in dynamic:
        shape = shapes.get(tensor.name)
        if shape is None:
            raise ConfigError(
                f"input {tensor.name!r} has dynamic dimensions {tuple(tensor.shape)}; give its "
                "shape for the engine (--shape NAME=1x3x224x224)"
            )
        profile.set_shape(tensor.name, shape, shape, shape)
    config.add_optimization_profile(profile)  # type: ignore[attr-defined]
