"""Build a TensorRT engine from a Q/DQ model and report each layer's precision.

Needs the ``tensorrt`` package (``pip install 'onnxq[tensorrt]'``) and a CUDA GPU; it is imported
only when called.  Everywhere else the static checker (:mod:`onnxq.backends.check`) is the guard.
TensorRT 11 builds every network strongly typed and has no precision flags (:func:`build_plan`);
its inspector JSON has ``I/O Tensors`` and per-tensor ``Datatype``/``Format`` where 10.x has
``Bindings`` and ``Format/Datatype`` (:func:`read_engine_information`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from onnxq.errors import BackendConstraintError, ConfigError, Violation

QUANTIZED = ("INT8", "FP8", "INT4", "FP4")
HALF = ("FP16", "BF16")
GROUPS = (("INT8/FP8/INT4/FP4", QUANTIZED), ("FP16/BF16", HALF), ("FP32", ("FP32",)))
_RANK = {"FP4": 0, "INT4": 1, "FP8": 2, "INT8": 3, "BF16": 4, "FP16": 4, "FP32": 5}
# Inspector spellings -> one name; 10.x also writes layouts ("Row major linear FP16 format").
_SPELLINGS = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for name, pattern in (
        ("FP4", r"\bFP4\b|\bFloat4|E2M1"),
        ("INT4", r"\bU?Int4\b"),
        ("FP8", r"\bFP8\b|\bFloat8|E4M3|E5M2"),
        ("INT8", r"\bInt8\b"),
        ("BF16", r"\bBF16\b|\bBFloat16\b"),
        ("FP16", r"\bFP16\b|\bHalf\b|\bFloat16\b"),
        ("FP32", r"\bFP32\b|\bFloat\b|\bFloat32\b"),
    )
)
_OTHER_TYPE = re.compile(r"\b(U?Int(?:8|32|64)|Bool|E8M0)\b", re.IGNORECASE)  # index types
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]*)\]")
# ONNX element type names -> the engine precision a Q/DQ of that type means (TensorRT reads a
# uint8 zero point as int8).
_QTYPE_PRECISION = {
    **dict.fromkeys(("INT8", "UINT8"), "INT8"),
    **dict.fromkeys(("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"), "FP8"),
    **dict.fromkeys(("INT4", "UINT4"), "INT4"),
    "FLOAT4E2M1": "FP4",
}
# Element types that make a 10.x build strongly typed: the graph states its own precisions.
_TYPED_NAMES = ("FLOAT16", "BFLOAT16", *(k for k in _QTYPE_PRECISION if k not in ("INT8", "UINT8")))


def precision_of(text: str) -> str:
    """The precision an inspector ``Datatype``/``DataType``/``Format/Datatype`` string names
    (``INT8``, ``FP8``, ``INT4``, ``FP4``, ``FP16``, ``BF16``, ``FP32``, ``INT32``, ...), or
    ``unknown`` when it names none (an 11.x ``Format`` is a layout only)."""
    for pattern, name in _SPELLINGS:
        if pattern.search(text):
            return name
    other = _OTHER_TYPE.search(text)
    return other.group(1).upper() if other else "unknown"


@dataclass(frozen=True)
class EngineTensor:
    """One tensor of the inspector's JSON: its precision and the text it was read from."""

    name: str
    precision: str
    datatype: str = ""  # 11.x ``Datatype``/``DataType``, or 10.x ``Format/Datatype``
    format: str = ""  # 11.x layout (``Format``, or the first ``ProfileInfo`` one of an I/O tensor)
    mode: str = ""  # I/O tensors: ``Input`` or ``Output`` (11.x ``IOMode``; 10.x: unknown)


@dataclass(frozen=True)
class EngineLayer:
    """One engine layer: its tensors and the ONNX nodes TensorRT says it computes."""

    name: str
    layer_type: str
    inputs: tuple[EngineTensor, ...] = ()
    outputs: tuple[EngineTensor, ...] = ()
    constants: tuple[EngineTensor, ...] = ()  # 11.x only (weights, scales)
    onnx_nodes: tuple[str, ...] = ()  # from ``Metadata`` (``[ONNX Layer: NAME]``) and ``Name``

    @property
    def precision(self) -> str:
        """The narrowest float or quantized type the layer reads (inputs and constants), else
        the one it writes, else the first type it has (``INT32``, ...), else ``unknown``."""
        reads = [t.precision for t in (*self.inputs, *self.constants)]
        writes = [t.precision for t in self.outputs]
        for group in (reads, writes):
            ranked = [p for p in group if p in _RANK]
            if ranked:
                return min(ranked, key=_RANK.__getitem__)
        known = [p for p in (*reads, *writes) if p != "unknown"]
        return known[0] if known else "unknown"


@dataclass(frozen=True)
class EngineReport:
    """The layers of a built engine, by precision, and the quantized ONNX nodes they run."""

    layers: tuple[EngineLayer, ...]
    io_tensors: tuple[EngineTensor, ...] = ()
    schema: str = "unknown"  # "10.x" (Bindings, Format/Datatype) or "11.x" (I/O Tensors)
    build: str = ""  # the TensorRT version and how the network was typed
    expected: Mapping[str, str] = field(default_factory=dict)  # ONNX node -> its Q/DQ precision

    @property
    def precisions(self) -> dict[str, int]:
        """How many layers run in each precision (:attr:`EngineLayer.precision`)."""
        return dict(Counter(layer.precision for layer in self.layers))

    def split(self) -> dict[str, tuple[str, ...]]:
        """Layer names by group: INT8/FP8/INT4/FP4, FP16/BF16, FP32 and ``other`` (index
        types, layers without tensors)."""
        groups = {p: label for label, members in GROUPS for p in members}
        out: dict[str, tuple[str, ...]] = {label: () for label, _ in (*GROUPS, ("other", ()))}
        for layer in self.layers:
            label = groups.get(layer.precision, "other")
            out[label] = (*out[label], layer.name)
        return out

    def _naming(self, node: str) -> list[EngineLayer]:
        return [layer for layer in self.layers if node in layer.onnx_nodes]

    @property
    def missed(self) -> dict[str, str]:
        """Quantized ONNX nodes whose engine layers all run in another precision (node -> the
        precisions of those layers)."""
        out = {}
        for node, want in self.expected.items():
            found = self._naming(node)
            if found and all(layer.precision != want for layer in found):
                out[node] = "/".join(sorted({layer.precision for layer in found}))
        return out

    @property
    def unlocated(self) -> tuple[str, ...]:
        """Quantized ONNX nodes that no layer's ``Metadata`` or ``Name`` names."""
        return tuple(node for node in self.expected if not self._naming(node))

    def summary(self) -> str:
        """The precision split, then whether the quantized ONNX nodes run as their Q/DQ say."""
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(self.precisions.items()))
        how = ", ".join(s for s in (self.build, f"inspector schema {self.schema}") if s)
        lines = [f"TensorRT engine: {len(self.layers)} layers ({parts}) [{how}]"]
        for label, names in self.split().items():
            lines.append(f"  {label}: {len(names)} layer(s)" + _names(names))
        if self.expected:
            want = Counter(self.expected.values())
            ok = len(self.expected) - len(self.missed) - len(self.unlocated)
            lines.append(
                f"  quantized ONNX nodes: {ok} of {len(self.expected)} run in the precision "
                f"of their Q/DQ ({', '.join(f'{k} x{v}' for k, v in sorted(want.items()))})"
            )
            for node, got in self.missed.items():
                lines.append(f"  not in {self.expected[node]}: {node!r} runs in {got}")
            if self.unlocated:
                lines.append(
                    "  not named by any engine layer (fused where TensorRT's layer "
                    "information does not say):" + _names(self.unlocated)
                )
        return "\n".join(lines)


def _names(names: tuple[str, ...], most: int = 6) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f": {', '.join(names[:most])}{more}" if names else ""


def _tensor(raw: Any) -> EngineTensor:
    """One tensor object of either schema (``Datatype``, ``DataType`` or ``Format/Datatype``)."""
    if not isinstance(raw, Mapping):
        return EngineTensor(str(raw), "unknown")
    typed = raw.get("Datatype", raw.get("DataType"))
    text = str(typed if typed is not None else raw.get("Format/Datatype", ""))
    layout = raw.get("Format")
    if layout is None and isinstance(raw.get("ProfileInfo"), list) and raw["ProfileInfo"]:
        first = raw["ProfileInfo"][0]
        layout = first.get("Format") if isinstance(first, Mapping) else None
    name, mode = str(raw.get("Name", "")), str(raw.get("IOMode", ""))
    return EngineTensor(name, precision_of(text), text, str(layout or ""), mode)


def _layer(raw: Any) -> EngineLayer:
    """One ``Layers`` entry: a detailed object, or a bare name (``LAYER_NAMES_ONLY``)."""
    if not isinstance(raw, Mapping):
        return EngineLayer(str(raw), "", onnx_nodes=tuple(str(raw).split(" + ")))
    name = str(raw.get("Name", ""))
    nodes = _ONNX_LAYER.findall(str(raw.get("Metadata", "")))
    nodes += [part for part in name.split(" + ") if part not in nodes]

    lists = (raw.get(key) for key in ("Inputs", "Outputs", "Constants"))
    ins, outs, consts = (tuple(map(_tensor, v)) if isinstance(v, list) else () for v in lists)
    return EngineLayer(name, str(raw.get("LayerType", "")), ins, outs, consts, tuple(nodes))


def read_engine_information(info: str | Mapping[str, Any]) -> EngineReport:
    """Parse the inspector's JSON (``get_engine_information(LayerInformationFormat.JSON)`` or
    ``trtexec --exportLayerInfo``) of TensorRT 10.x or 11.x into one record per layer."""
    data = json.loads(info) if isinstance(info, str) else info
    layers = tuple(_layer(raw) for raw in data.get("Layers") or [])
    io: tuple[EngineTensor, ...] = ()
    if isinstance(data.get("I/O Tensors"), list):
        schema = "11.x"
        io = tuple(_tensor(raw) for raw in data["I/O Tensors"])
    elif isinstance(data.get("Bindings"), list):
        schema = "10.x"  # names only: the type and mode come from the layers' tensors
        known = {t.name: replace(t, mode="Input") for lay in layers for t in lay.inputs}
        known.update((t.name, replace(t, mode="Output")) for lay in layers for t in lay.outputs)
        io = tuple(known.get(n, EngineTensor(n, "unknown")) for n in map(str, data["Bindings"]))
    else:
        tensors = [t for layer in layers for t in (*layer.inputs, *layer.outputs)]
        schema = "11.x" if any(t.format for t in tensors) else "10.x" if tensors else "unknown"
    return EngineReport(layers, io, schema)


def quantized_readers(model: Any) -> dict[str, str]:
    """ONNX node name -> the precision (INT8, FP8, INT4, FP4) its activation Q/DQ means: the
    nodes that read a DequantizeLinear fed by a QuantizeLinear (weight-only DQs are left out)."""
    import onnx

    from onnxq.ir.bodies import every_graph, every_node

    types: dict[str, int] = {}
    for graph in every_graph(model.graph):
        types.update((t.name, t.data_type) for t in graph.initializer)
    nodes = list(every_node(model.graph))
    q_out: dict[str, int] = {}
    for node in nodes:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and "value" in attrs:
            types[node.output[0]] = attrs["value"].t.data_type
        elif node.op_type == "QuantizeLinear":
            zero = node.input[2] if len(node.input) > 2 else ""
            dtype = attrs["output_dtype"].i if "output_dtype" in attrs else onnx.TensorProto.UINT8
            q_out[node.output[0]] = types.get(zero, dtype)
    dq_out = {
        n.output[0]: q_out[n.input[0]]
        for n in nodes
        if n.op_type == "DequantizeLinear" and n.input and n.input[0] in q_out
    }
    readers: dict[str, str] = {}
    for node in nodes:
        qtypes = [onnx.TensorProto.DataType.Name(dq_out[i]) for i in node.input if i in dq_out]
        qtypes = [q for q in qtypes if q in _QTYPE_PRECISION]
        if qtypes and node.name and node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            readers[node.name] = _QTYPE_PRECISION[qtypes[0]]
    return readers


def carries_typed_precisions(model: Any) -> bool:
    """Whether the graph states non-FP32 float or sub-INT8 precisions (FP16, BF16, FP8, INT4,
    FP4 in a tensor type, an initializer, a Cast's ``to`` or a Q/DQ ``output_dtype``)."""
    import onnx

    from onnxq.ir.bodies import every_graph

    typed = {getattr(onnx.TensorProto, n) for n in _TYPED_NAMES if hasattr(onnx.TensorProto, n)}
    for graph in every_graph(model.graph):
        found = {t.data_type for t in graph.initializer}
        found |= {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
        found |= {v.type.tensor_type.elem_type for v in graph.value_info}
        attrs = [a for node in graph.node for a in node.attribute]
        found |= {a.i for a in attrs if a.name in ("to", "output_dtype") and a.type == a.INT}
        found |= {a.t.data_type for a in attrs if a.type == a.TENSOR}
        if found & typed:
            return True
    return False


def tensorrt_major(trt: Any) -> int:
    """The major version of the imported ``tensorrt`` module (``trt.__version__``)."""
    version = str(getattr(trt, "__version__", ""))
    match = re.match(r"\s*(\d+)(\.|$)", version)
    if match is None:
        raise ConfigError(f"cannot read TensorRT's version from tensorrt.__version__ {version!r}")
    return int(match.group(1))


@dataclass(frozen=True)
class BuildPlan:
    """How the network is created and configured on the imported TensorRT."""

    version: str
    network_flags: int  # the ``create_network`` argument
    builder_flags: tuple[str, ...]  # ``BuilderFlag`` members set on the config
    strongly_typed: bool

    def describe(self) -> str:
        flags = "+".join(self.builder_flags) or "no precision flags"
        typing = "strongly typed" if self.strongly_typed else f"weakly typed with {flags}"
        return f"TensorRT {self.version}, {typing}"


def build_plan(trt: Any, typed_model: bool) -> BuildPlan:
    """11.x: ``create_network(0)``, always strongly typed (its ``STRONGLY_TYPED`` flag is kept but
    ignored, and the precision flags are gone).  10.x: ``STRONGLY_TYPED`` when the model states
    its precisions (``typed_model``: FP16/BF16/FP8/INT4/FP4 types), so the engine is the one 11.x
    builds; else weakly typed with INT8 and FP16 allowed, as onnxq built before."""
    version = str(getattr(trt, "__version__", ""))
    if tensorrt_major(trt) >= 11:
        return BuildPlan(version, 0, (), True)
    creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
    strong = getattr(creation, "STRONGLY_TYPED", None)
    if typed_model and strong is not None:
        return BuildPlan(version, 1 << int(strong), (), True)
    builder_flag = getattr(trt, "BuilderFlag", None)
    flags = tuple(name for name in ("INT8", "FP16") if hasattr(builder_flag, name))
    return BuildPlan(version, 0, flags, False)


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
    """Parse ``model_path`` with TensorRT's ONNX parser, build an engine (:func:`build_plan`),
    inspect it and compare each quantized ONNX node with the layer that runs it.

    ``shapes`` fixes dynamic input dimensions (used as min = opt = max of one profile).
    """
    reason = tensorrt_available()
    if reason:
        raise ConfigError(f"cannot build a TensorRT engine (--engine): {reason}")
    import onnx
    import tensorrt as trt

    model = onnx.load(str(model_path), load_external_data=False)
    plan = build_plan(trt, carries_typed_precisions(model))
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(plan.network_flags)
    _parse(trt.OnnxParser(network, logger), model_path)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb * 2**20)
    for name in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    _add_profile(builder, network, config, shapes or {})
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendConstraintError(f"TensorRT failed to build an engine from {model_path}")
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    report = read_engine_information(info)
    return replace(report, build=plan.describe(), expected=quantized_readers(model))


def _parse(parser: Any, model_path: str | Path) -> None:
    if parser.parse_from_file(str(model_path)):
        return
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


def _add_profile(
    builder: object, network: object, config: object, shapes: dict[str, tuple[int, ...]]
) -> None:
    count = network.num_inputs  # type: ignore[attr-defined]
    inputs = [network.get_input(i) for i in range(count)]  # type: ignore[attr-defined]
    dynamic = [tensor for tensor in inputs if any(d < 0 for d in tensor.shape)]
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
