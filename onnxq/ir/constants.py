"""Facts about ONNX protos that every part of ``onnxq.ir`` shares."""

# Protobuf cannot serialize a message of 2 GiB or more; stay well below it.
PROTO_LIMIT = 2**31 - 2**26
DEFAULT_DOMAINS = ("", "ai.onnx")


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

# onnxruntime's operator-format (and dynamic) quantization: integer ops instead of Q/DQ pairs.
# TensorRT reads only Q/DQ; onnxq neither re-quantizes these nor checks them as Q/DQ groups.
INTEGER_OPS = frozenset(
    {
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLinear",
        "DynamicQuantizeLSTM",
        "DynamicQuantizeMatMul",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "QOrderedMatMul",
        "QOrderedAttention",
        "QOrderedLayerNormalization",
        "QOrderedGelu",
        "QOrderedLongformerAttention",
    }
)


# onnxruntime's weight-only ops (com.microsoft): integer weights, float activations.
WEIGHT_ONLY_OPS = frozenset({"MatMulNBits", "GatherBlockQuantized", "MatMulBnb4", "MatMulFpQ4"})


def is_integer_op(op_type: str) -> bool:
    """Whether ``op_type`` is an integer op of operator-format quantization (QLinearConv,
    ConvInteger, DynamicQuantizeLSTM, ...), not a Q/DQ node."""
    return op_type in INTEGER_OPS or op_type.startswith("QLinear")
