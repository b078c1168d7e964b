"""TensorRT 11's strong typing, checked statically: the rules as data (:data:`TYPING_RULES`).

A strongly typed TensorRT network takes its precisions from the ONNX tensor types: nothing is
converted for it, so a node fed two float types, a Q/DQ pair whose scale disagrees with the
tensor it scales, or a tensor of unknown type fails in the parser or runs in the wrong
precision.  :func:`check_typing` reads the types a model declares and the ones onnx's shape
inference finds (``strict_mode=False``: a node that cannot be inferred leaves its outputs
untyped, a model that cannot be inferred at all keeps its own annotations), walks control-flow
bodies with their outer scopes, and returns one :class:`~onnxq.errors.Violation` per offending
node or tensor, its field opening with the rule's id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from onnxq import ir
from onnxq.errors import Violation
from onnxq.ir.weightless import weights_stripped

TRT_QUANTIZED_TYPES = (
    "https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/"
    "quantized-types-explicit-quantization.html"
)
ONNX_QUANTIZE = "https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html"
ONNX_DEQUANTIZE = "https://onnx.ai/onnx/operators/onnx__DequantizeLinear.html"
ONNX_ADD = "https://onnx.ai/onnx/operators/onnx__Add.html"  # A and B: one type constraint T
TRT_NVINFER = "https://github.com/NVIDIA/TensorRT/blob/release/11.1/include/NvInfer.h"
TRT_11_RELEASE = (
    "https://docs.nvidia.com/deeplearning/tensorrt/11.0.0/getting-started/release-notes-11/"
    "11.0.0.html"
)

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
HALF_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
HALF_SCALE_OPSET = 19  # QuantizeLinear-19 / DequantizeLinear-19: float16 and bfloat16 scales
SCALE_TYPE_FREE_OPSET = 23  # x and y_scale may differ; DQ-23: output_dtype
NOT_A_TENSOR = -1  # a known type that is not a tensor (sequence, optional, map)


def type_name(elem: int) -> str:
    """``float16`` for ``TensorProto.FLOAT16`` (``unknown`` for 0)."""
    if elem == NOT_A_TENSOR:
        return "a non-tensor type"
    return TensorProto.DataType.Name(elem).lower() if elem else "unknown"


class Scope:
    """One graph's tensor types and producers, falling back to the enclosing graphs'."""

    def __init__(self, graph: onnx.GraphProto, outer: Scope | None) -> None:
        self.outer = outer
        self.types: dict[str, int] = {t.name: int(t.data_type) for t in graph.initializer}
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            elem = _elem(vi.type)
            if elem is not None:
                self.types[vi.name] = elem
        self.producer = {out: n for n in graph.node for out in n.output if out}
        self.inputs = {i.name for i in graph.input}

    def elem_type(self, name: str) -> int | None:
        """The element type of ``name`` here or in an outer scope (None: untyped)."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.types:
                return scope.types[name]
            scope = scope.outer
        return None

    def origin(self, name: str) -> str | onnx.NodeProto | None:
        """The node that makes ``name``, ``"input"`` for a graph input, None if undefined."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.producer:
                return scope.producer[name]
            if name in scope.inputs:
                return "input"
            scope = scope.outer
        return None


def _elem(t: onnx.TypeProto) -> int | None:
    kind = t.WhichOneof("value")
    if kind is None:
        return None
    if kind == "tensor_type":
        return int(t.tensor_type.elem_type) or None
    return NOT_A_TENSOR


@dataclass(frozen=True)
class Site:
    """A node to check: its display name (with the bodies it sits in), its scope, the opset."""

    node: onnx.NodeProto
    name: str
    scope: Scope
    opset: int


@dataclass(frozen=True)
class TypedModel:
    """The model's graphs with their types; ``inferred``: shape inference ran."""

    sites: tuple[Site, ...]
    inferred: bool


def typed_model(model: onnx.ModelProto) -> TypedModel:
    """``model``'s nodes with the types declared and inferred (the model is not changed)."""
    inferred = True
    with weights_stripped(model) as light:
        try:
            typed = onnx.shape_inference.infer_shapes(light, strict_mode=False)
        except Exception:  # inference is a help: check what the model declares
            typed, inferred = light, False
    opset = ir.opset_version(model)
    return TypedModel(tuple(_sites(typed.graph, "", None, opset)), inferred)


def _sites(graph: onnx.GraphProto, prefix: str, outer: Scope | None, opset: int) -> Iterator[Site]:
    scope = Scope(graph, outer)
    for node in graph.node:
        yield Site(node, f"{prefix}{node.name or node.op_type}", scope, opset)
        for attr in node.attribute:
            for sub in ir.attr_graphs(attr):
                yield from _sites(sub, f"{prefix}{node.name}/{attr.name}/", scope, opset)


# --------------------------------------------------------------------------- the rules
def mixed_input_types(model: TypedModel) -> list[Violation]:
    """Inputs that share a type constraint of the op's schema have one element type."""
    out = []
    for site in model.sites:
        node = site.node
        if node.op_type in ir.QDQ_OPS or node.domain not in ir.DEFAULT_DOMAINS:
            continue
        for constraint, params, typed in _constraint_groups(site):
            if len({elem for _, elem in typed}) < 2:
                continue
            got = ", ".join(f"{type_name(e)} ({tensor!r})" for tensor, e in typed)
            out.append(
                Violation(
                    site.name,
                    f"{MIXED_INPUT_TYPES} ({node.op_type} inputs {', '.join(params)} share "
                    f"type {constraint})",
                    "one element type",
                    f"{got}; Cast the inputs to one type (TensorRT's strong typing converts "
                    "nothing itself)",
                )
            )
    return out


def _constraint_groups(site: Site) -> list[tuple[str, list[str], list[tuple[str, int]]]]:
    """Per type constraint that two or more inputs share: its name, the formal inputs, and
    the typed tensors (name, element type) that fill them."""
    node = site.node
    schema = _schema(node, site.opset)
    if schema is None:
        return []
    constraints = {t.type_param_str for t in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    groups: dict[str, tuple[list[str], list[tuple[str, int]]]] = {}
    formal = list(schema.inputs)
    for i, tensor in enumerate(node.input):
        if not formal:
            break
        param = formal[min(i, len(formal) - 1)]
        if i >= len(formal) and param.option != variadic:
            break
        if param.type_str not in constraints or (
            param.option == variadic and not param.is_homogeneous
        ):
            continue
        params, typed = groups.setdefault(param.type_str, ([], []))
        if param.name not in params:
            params.append(param.name)
        elem = site.scope.elem_type(tensor) if tensor else None
        if elem is not None and elem != NOT_A_TENSOR:
            typed.append((tensor, elem))
    return [(c, p, t) for c, (p, t) in groups.items() if len(t) > 1]


def _schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    """The default-domain schema of ``node`` at ``opset`` (None: no such op, or another
    domain)."""
    if node.domain not in ir.DEFAULT_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:  # an op newer than this onnx, or a typo: not checkable
        return None


def qdq_type_agreement(model: TypedModel) -> list[Violation]:
    """QuantizeLinear's x and y_scale have one float type, and DequantizeLinear's typed output
    has x_scale's type: ONNX's rule up to opset 22 (Q/DQ-19: one type T1 / T2); from opset 23,
    where ONNX lets them differ, TensorRT's for a float16 or bfloat16 scale."""
    out = []
    for site in model.sites:
        node = site.node
        if node.op_type not in ir.QDQ_OPS or node.domain not in ir.DEFAULT_DOMAINS:
            continue
        if len(node.input) < 2 or not node.input[1]:
            continue
        scale = site.scope.elem_type(node.input[1])
        if scale is None or scale == NOT_A_TENSOR:
            continue
        if scale not in FLOAT_TYPES:
            out.append(_agreement(site, "scale", f"{type_name(scale)} scale {node.input[1]!r}"))
        elif node.op_type == "QuantizeLinear":
            if site.opset >= SCALE_TYPE_FREE_OPSET and scale not in HALF_TYPES:
                continue  # a float scale may scale another float type
            x = site.scope.elem_type(node.input[0])
            if x is not None and x not in (NOT_A_TENSOR, scale):
                what = f"x {node.input[0]!r} {type_name(x)}"
                out.append(_agreement(site, "x and y_scale", f"{what}, {_scale(node, scale)}"))
        elif scale == TensorProto.FLOAT or site.opset >= HALF_SCALE_OPSET:
            # (a half scale below opset 19 is qdq-scale-opset's: DequantizeLinear-13 is float)
            y = site.scope.elem_type(node.output[0])
            asked = _output_dtype(node, site.opset)  # DQ-23: y is output_dtype, if given
            if y is None or y == NOT_A_TENSOR:
                continue
            # ONNX: y is output_dtype or the scale's type; TensorRT: a half scale's type
            if y != (asked or scale) or (scale in HALF_TYPES and y != scale):
                what = f"y {node.output[0]!r} {type_name(y)}"
                if asked:
                    what += f" (output_dtype {type_name(asked)})"
                out.append(_agreement(site, "y and x_scale", f"{what}, {_scale(node, scale)}"))
    return out


def _output_dtype(node: onnx.NodeProto, opset: int) -> int:
    """DequantizeLinear-23's ``output_dtype`` (0: not given, or an earlier opset)."""
    if opset < SCALE_TYPE_FREE_OPSET:
        return 0
    return int(ir.node_attrs(node).get("output_dtype", 0))


def _scale(node: onnx.NodeProto, scale: int) -> str:
    label = "y_scale" if node.op_type == "QuantizeLinear" else "x_scale"
    return f"{label} {node.input[1]!r} {type_name(scale)}"


def _agreement(site: Site, what: str, got: str) -> Violation:
    if site.opset >= SCALE_TYPE_FREE_OPSET:
        kinds = "TensorRT: a float16 or bfloat16 scale matches the tensor it scales"
    elif site.opset >= HALF_SCALE_OPSET:
        kinds = "float, float16 or bfloat16"
    else:
        kinds = f"float; float16 and bfloat16 from opset {HALF_SCALE_OPSET}"
    return Violation(
        site.name,
        f"{QDQ_TYPE_AGREEMENT} ({site.node.op_type} {what})",
        f"one float type ({kinds})",
        f"{got}; store the scale in the type of the float tensor it scales, or Cast that "
        "tensor to the scale's type",
    )


def qdq_scale_opset(model: TypedModel) -> list[Violation]:
    """A float16 or bfloat16 scale needs QuantizeLinear-19 / DequantizeLinear-19."""
    out = []
    for site in model.sites:
        node = site.node
        if node.op_type not in ir.QDQ_OPS or node.domain not in ir.DEFAULT_DOMAINS:
            continue
        if len(node.input) < 2 or not node.input[1] or site.opset >= HALF_SCALE_OPSET:
            continue
        scale = site.scope.elem_type(node.input[1])
        if scale in HALF_TYPES:
            out.append(
                Violation(
                    site.name,
                    f"{QDQ_SCALE_OPSET} ({node.op_type} scale {node.input[1]!r})",
                    f"opset >= {HALF_SCALE_OPSET} for a {type_name(scale)} scale (earlier "
                    f"{node.op_type} takes float scales only)",
                    f"opset {site.opset}; convert the model to opset {HALF_SCALE_OPSET} or "
                    "later, or store the scale as float",
                )
            )
    return out


def untyped_tensors(model: TypedModel) -> list[Violation]:
    """Every tensor a node reads has a known type (after inference; outer scopes count).
    Outputs onnx cannot infer (custom-domain and ``ai.onnx.ml`` ops) are left to their op."""
    if not model.inferred:
        return []  # inference failed as a whole: everything it would type is untyped
    out = []
    seen: set[str] = set()
    for site in model.sites:
        for tensor in site.node.input:
            if not tensor or tensor in seen or site.scope.elem_type(tensor) is not None:
                continue
            seen.add(tensor)
            origin = site.scope.origin(tensor)
            if isinstance(origin, onnx.NodeProto) and not _inferable(origin, site.opset):
                continue
            made = (
                f"output of {origin.op_type} {origin.name!r}"
                if isinstance(origin, onnx.NodeProto)
                else "a graph input declared without a type"
                if origin == "input"
                else "not defined in any enclosing graph"
            )
            out.append(
                Violation(
                    site.name,
                    f"{UNTYPED_TENSOR} (input {tensor!r} of {site.node.op_type})",
                    "a known element type (a graph input, initializer, value_info or an "
                    "inferable node output)",
                    f"no type ({made}); declare it in value_info (onnx's shape inference "
                    "cannot type it)",
                )
            )
    return out


def _inferable(node: onnx.NodeProto, opset: int) -> bool:
    """Whether onnx's shape inference can type ``node``'s outputs: a default-domain op with
    a type inference function (custom ops and ``ai.onnx.ml`` ones are left to their op)."""
    schema = _schema(node, opset)
    return schema is not None and bool(schema.has_type_and_shape_inference_function)


# --------------------------------------------------------------------------- the table
MIXED_INPUT_TYPES = "mixed-input-types"
QDQ_TYPE_AGREEMENT = "qdq-type-agreement"
QDQ_SCALE_OPSET = "qdq-scale-opset"
UNTYPED_TENSOR = "untyped-tensor"


@dataclass(frozen=True)
class TypingRule:
    """One typing rule: its id (each violation's field opens with it), what it checks, the
    documents it comes from, and the function that finds its violations."""

    id: str
    checks: str
    sources: tuple[str, ...]
    find: Callable[[TypedModel], list[Violation]]


TYPING_RULES: tuple[TypingRule, ...] = (
    TypingRule(
        MIXED_INPUT_TYPES,
        "inputs that share a type constraint of the op's schema (Add's A and B, Conv's X, W "
        "and B: T) have one element type",
        (ONNX_ADD, TRT_11_RELEASE),
        mixed_input_types,
    ),
    TypingRule(
        QDQ_TYPE_AGREEMENT,
        "QuantizeLinear's x and y_scale have one float type; DequantizeLinear's typed output "
        "has x_scale's type (output_dtype's, if given); from opset 23, where ONNX lets them "
        "differ, only a float16 or bfloat16 scale must match (TensorRT)",
        (ONNX_QUANTIZE, ONNX_DEQUANTIZE, TRT_NVINFER, TRT_QUANTIZED_TYPES),
        qdq_type_agreement,
    ),
    TypingRule(
        QDQ_SCALE_OPSET,
        "a float16 or bfloat16 Q/DQ scale needs opset >= 19",
        (ONNX_QUANTIZE, ONNX_DEQUANTIZE),
        qdq_scale_opset,
    ),
    TypingRule(
        UNTYPED_TENSOR,
        "every tensor a node reads has a known element type after shape inference",
        (TRT_QUANTIZED_TYPES,),
        untyped_tensors,
    ),
)


def check_typing(
    model: onnx.ModelProto, rules: tuple[TypingRule, ...] = TYPING_RULES
) -> list[Violation]:
    """Every violation of ``rules`` (all typing rules by default) in ``model``."""
    typed = typed_model(model)
    return [v for rule in rules for v in rule.find(typed)]
