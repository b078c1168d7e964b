"""The first stage: a model ready for placement.

Load it (or copy an in-memory one), refuse one that is already quantized, turn initializers
that are also graph inputs into plain weights, stamp an IR version onnxruntime reads, keep the
float model for the fidelity check, and simplify.  What changed on the way comes back as data
(:class:`Prepared`), which the report's messages put in words.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.errors import ConfigError, UnsupportedModelError
from onnxq.prepare.simplify import simplify
from onnxq.prepare.upcast import HALF_NAMES, half_types, upcast

ModelLike = str | os.PathLike[str] | onnx.ModelProto


@dataclass(frozen=True)
class IrDowngrade:
    """The model's IR version was newer than onnxruntime reads; onnxq stamped an older one."""

    from_ir: int
    to_ir: int
    onnxruntime: str  # the installed onnxruntime's version


@dataclass
class Prepared:
    """The model as placement gets it, and what preparing it changed.

    Attributes:
        model: loaded, checked, shape-inferred and simplified (later stages edit it).
        source: the file it came from (None: an in-memory model).
        load: what loading changed (a topological sort, an opset conversion).
        weight_inputs: initializers that were also graph inputs, now plain weights.
        ir_downgrade: the IR version onnxq stamped, when the model's was too new.
        reference: the float model before simplification, serialized, for the fidelity check
            (None: the proto holds too much to keep a copy).
        passes: the simplify passes that changed something.
    """

    model: onnx.ModelProto
    source: Path | None
    load: ir.LoadRecord
    weight_inputs: list[str]
    ir_downgrade: IrDowngrade | None
    reference: bytes | None
    passes: list[str]

    def take_reference(self) -> bytes | None:
        """The float reference, handed over once: the bytes (up to 2 GB) are not kept while
        the quantized model is built."""
        reference, self.reference = self.reference, None
        return reference


def prepare(
    model: ModelLike, profile: BackendProfile, simplify_graph: bool = True, widen: bool = True
) -> Prepared:
    """Load ``model`` for ``profile`` and make it ready for placement (see the module);
    ``widen``: an FP16/BF16 model is worked on in its FP32 form (:mod:`onnxq.prepare.upcast`;
    the weight-only run keeps the model's types)."""
    record = ir.LoadRecord()
    loaded, source = load(model, profile, record)
    refuse_quantized(loaded, source, profile)
    if widen:  # an FP16/BF16 model: computed in FP32 while onnxq works on it
        kinds = half_types(loaded)
        record.half_io = upcast(loaded)
        record.widened = tuple(HALF_NAMES[k] for k in sorted(kinds))
    weight_inputs = ir.drop_initializer_inputs(loaded)
    downgrade = _fit_ir_version(loaded)
    reference = _float_reference(loaded)
    passes: list[str] = []
    if simplify_graph:
        loaded, passes = simplify(loaded)
    return Prepared(loaded, source, record, weight_inputs, downgrade, reference, passes)


def load(
    model: ModelLike, profile: BackendProfile, record: ir.LoadRecord | None = None
) -> tuple[onnx.ModelProto, Path | None]:
    """Load from a path, or take a copy of an in-memory model (the caller's stays untouched);
    a topological sort or an opset upgrade is written into ``record``."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        ir.sort_nodes(copy, record)
        ir.check_model(copy, where="model")
        copy = ir.upgrade_opset(copy, profile.min_opset, record=record)
        ir.name_nodes(copy.graph)
        ir.unshare_biases(copy.graph)
        return ir.infer_shapes(copy), None
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    return ir.load_model(model, profile.min_opset, record=record), Path(model)


def refuse_quantized(model: onnx.ModelProto, source: Path | None, profile: BackendProfile) -> None:
    """Raise :class:`UnsupportedModelError` if ``model`` already holds Q/DQ or integer ops: it
    is not onnxq's input, its quantization would clash with the backend's (uint8 zero points
    under TensorRT, double rounding)."""
    nodes = list(ir.every_node(model.graph))  # control-flow bodies included
    qdq = sorted({n.op_type for n in nodes if n.op_type in ir.QDQ_OPS})
    integer = sorted({n.op_type for n in nodes if ir.is_integer_op(n.op_type)})
    weight_only = sorted({n.op_type for n in nodes if n.op_type in ir.WEIGHT_ONLY_OPS})
    where = source.name if source else "the model"
    if weight_only and not (qdq or integer):
        raise UnsupportedModelError(
            f"{where} already holds weight-only quantized ops ({', '.join(weight_only)}); "
            "onnxq quantizes float models: give it the float original"
        )
    if not (qdq or integer):
        return
    if integer:
        trt = "TensorRT reads only Q/DQ models and " if set(integer) & profile.forbidden_ops else ""
        raise UnsupportedModelError(
            f"{where} is already quantized in onnxruntime's operator format (it holds "
            f"{', '.join(integer + qdq)}); {trt}onnxq quantizes float models: give it the "
            "float original"
        )
    raise UnsupportedModelError(
        f"{where} is already quantized (it holds {', '.join(qdq)}); onnxq quantizes float "
        "models: give it the float original, or run `onnxq check MODEL --backend B` to "
        "check this one"
    )


def _fit_ir_version(model: onnx.ModelProto) -> IrDowngrade | None:
    """Stamp a model newer than onnxruntime reads with the IR version it reads, when the model
    uses nothing newer (onnx's own ``make_model`` writes its latest IR)."""
    from importlib.metadata import version

    newest, old = ir.runtime_ir_version(), model.ir_version
    if old <= newest or not ir.lower_ir_version(model, newest):
        return None  # a model that needs its IR version gets onnxruntime's own refusal
    return IrDowngrade(old, newest, version("onnxruntime"))


def _float_reference(model: onnx.ModelProto) -> bytes | None:
    """The loaded float model, kept for the fidelity check: its serialization, in which weights
    left on disk stay references (a few KB); None when the proto itself holds too much."""
    if ir.inline_nbytes(model) >= ir.PROTO_LIMIT:
        return None
    return ir.serialize(model, load_lazy=False)
