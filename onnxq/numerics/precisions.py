"""Precisions as data: the element types a Q/DQ pair can carry and the precisions a run asks for.

A :class:`QType` is one element type of a QuantizeLinear/DequantizeLinear pair (int8, uint8,
int16, uint16, float8e4m3fn, int32): its ONNX type, the numpy type of its values, its range and
the opset (or the contrib domain) where onnxruntime and ONNX accept it.  A :class:`Precision` is
what a config names (``int8``, ``int16``, ``fp8``): the QType of its activations (signed or
unsigned, as the backend wants them) and of its weights.  Observers, materialize and the checker
read these tables; nothing branches on a precision's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from onnxq.errors import ConfigError

# the contrib domain where onnxruntime runs 16-bit QuantizeLinear/DequantizeLinear at any opset
CONTRIB_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class QType:
    """One element type of a Q/DQ pair.

    Attributes:
        name: ONNX's lower-case name (``int8``, ``uint16``, ``float8e4m3fn``, ...).
        onnx_type: the ``TensorProto`` element type.
        qmin, qmax: the representable range (FP8 E4M3: +-448, its largest finite value).
        bits: storage bits.
        is_float: a float format (rounds to its own non-uniform grid, scale = amax / qmax).
        min_opset: the lowest default-domain opset whose QuantizeLinear/DequantizeLinear takes
            it (10 for the 8-bit integers, whose per-axis scales need 13, checked apart; 19
            for FP8; 21 for 16-bit).
        contrib_domain: a domain whose Q/DQ take it at any opset (onnxruntime's
            ``com.microsoft`` for 16-bit integers), or None.
    """

    name: str
    onnx_type: int
    qmin: float
    qmax: float
    bits: int
    is_float: bool = False
    min_opset: int = 13
    contrib_domain: str | None = None

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy type of its values (``ml_dtypes.float8_e4m3fn`` for FP8, as onnx uses)."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.onnx_type))

    @property
    def signed(self) -> bool:
        """Whether it holds negative values."""
        return self.qmin < 0

    def zeros(self, shape: tuple[int, ...] = ()) -> np.ndarray:
        """A zero point of 0 in this type."""
        return np.zeros(shape, dtype=self.numpy_dtype)

    def cast(self, values: np.ndarray) -> np.ndarray:
        """``values`` (already divided by the scale, zero point added) rounded and saturated
        into this type, as QuantizeLinear does (round half to even; FP8 saturates to +-448)."""
        clipped = np.clip(np.asarray(values, dtype=np.float32), self.qmin, self.qmax)
        if self.is_float:
            return clipped.astype(self.numpy_dtype)
        return np.rint(clipped).astype(self.numpy_dtype)

    def domain_for(self, opset: int) -> str:
        """The domain its Q/DQ nodes use in a model of default-domain ``opset``: the default
        one where that opset takes the type, else the contrib domain."""
        if opset >= self.min_opset or self.contrib_domain is None:
            return ""
        return self.contrib_domain


QTYPES: dict[str, QType] = {
    q.name: q
    for q in (
        QType("int8", TensorProto.INT8, -128, 127, 8, min_opset=10),
        QType("uint8", TensorProto.UINT8, 0, 255, 8, min_opset=10),
        QType("int16", TensorProto.INT16, -32768, 32767, 16, min_opset=21,
              contrib_domain=CONTRIB_DOMAIN),
        QType("uint16", TensorProto.UINT16, 0, 65535, 16, min_opset=21,
              contrib_domain=CONTRIB_DOMAIN),
        QType("float8e4m3fn", TensorProto.FLOAT8E4M3FN, -448.0, 448.0, 8, is_float=True,
              min_opset=19),
        QType("int32", TensorProto.INT32, -(2**31), 2**31 - 1, 32, min_opset=10),
    )
}  # fmt: skip


def qtype_of(onnx_type: int) -> QType | None:
    """The QType of a ``TensorProto`` element type, or None (not a Q/DQ type onnxq knows)."""
    for q in QTYPES.values():
        if q.onnx_type == onnx_type:
            return q
    return None


@dataclass(frozen=True)
class Precision:
    """What a run (or an override) asks for: the activation and weight element types.

    ``activation_signed`` / ``activation_unsigned``: the activation QType for a backend that
    wants signed (symmetric, TensorRT) or unsigned (onnxruntime's asymmetric uint8) values.
    ``weight``: the weight QType (A16W8 keeps 8-bit weights).
    """

    name: str
    activation_signed: QType
    activation_unsigned: QType
    weight: QType
    summary: str

    def activation(self, unsigned: bool) -> QType:
        """The activation QType for a backend that wants unsigned (or signed) activations."""
        return self.activation_unsigned if unsigned else self.activation_signed


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            "int8", QTYPES["int8"], QTYPES["uint8"], QTYPES["int8"], "8-bit integer activations "
            "and weights"),
        Precision(
            "int16", QTYPES["int16"], QTYPES["uint16"], QTYPES["int8"], "16-bit integer "
            "activations, 8-bit integer weights (A16W8)"),
        Precision(
            "fp8", QTYPES["float8e4m3fn"], QTYPES["float8e4m3fn"], QTYPES["float8e4m3fn"],
            "FP8 E4M3 activations and weights"),
    )
}  # fmt: skip


def precision(name: str, where: str = "precision") -> Precision:
    """The precision called ``name``; a :class:`ConfigError` naming the valid ones otherwise."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ConfigError(
            f"{where}: unknown precision {name!r}; valid: {', '.join(PRECISIONS)}"
        ) from None


def activation_qtype(precision_name: str, backend_activation_dtype: str) -> QType:
    """The activation QType of ``precision_name`` for a backend whose 8-bit activations are
    ``backend_activation_dtype`` (``uint8``: the unsigned variant)."""
    unsigned = not QTYPES[backend_activation_dtype].signed
    return PRECISIONS[precision_name].activation(unsigned)


def tensor_qtype(kind: str, precision_name: str, backend_activation_dtype: str) -> QType:
    """The element type of one annotated tensor: its precision's weight type for a weight, its
    activation type (signed or unsigned, as the backend's 8-bit activations) otherwise."""
    chosen = PRECISIONS[precision_name]
    if kind == "weight":
        return chosen.weight
    return chosen.activation(unsigned=not QTYPES[backend_activation_dtype].signed)


def check_bits(bits: int | None, qtype: QType, tensor: str) -> None:
    """A :class:`ConfigError` when an override's ``bits`` cannot narrow ``qtype``."""
    if bits is None:
        return
    if qtype.is_float:
        raise ConfigError(
            f"overrides: bits={bits} for tensor {tensor!r}, whose type is {qtype.name}: bits "
            "narrows integer types only; drop 'bits' or give the tensor an integer precision"
        )
    if bits > qtype.bits:
        raise ConfigError(
            f"overrides: bits={bits} for tensor {tensor!r}, whose type is {qtype.name} "
            f"({qtype.bits} bits; weights are 8-bit in every precision): use bits <= "
            f"{qtype.bits}, or precision: int16 for a 16-bit activation"
        )


__all__ = [
    "CONTRIB_DOMAIN",
    "PRECISIONS",
    "QTYPES",
    "Precision",
    "QType",
    "activation_qtype",
    "check_bits",
    "precision",
    "qtype_of",
    "tensor_qtype",
]
