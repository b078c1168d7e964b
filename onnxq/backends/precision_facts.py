"""What each backend does with FP8, INT16, dynamic quantization and recurrent cells, as data.

The backend profiles (``onnxq.backends.profile``) take these values; the sources of every fact
are in ``docs/precisions.md`` (TensorRT's developer guide and ONNX parser, ModelOpt's FP8 ONNX
quantizer, onnxruntime's contrib ops, measurements on this project's machines).
"""

from __future__ import annotations

RECURRENT_OPS = ("LSTM", "GRU", "RNN")

# --------------------------------------------------------------------------------- TensorRT
# A TensorRT run in FP8: Q/DQ of float8e4m3fn need opset 19; ModelOpt's FP8 mode keeps float the
# convs whose filter passes 32 elements, or with 16 or fewer input (per group) or output
# channels (TensorRT's FP8 conv kernels lose to its FP16 ones there).  Activation ranges are
# amax (the non-uniform FP8 grid keeps its relative precision up to 448 x scale, so clipping
# buys little), which ``activation_qparams`` applies to ``auto``.
FP8_VALIDATION_NOTE = (
    "FP8 Q/DQ: fidelity is measured with onnxruntime's graph optimizations off (what TensorRT "
    "computes). Do not check an FP8 model in onnxruntime's default session: its extended "
    "optimizations (1.32: the Level2 rule-based transformer's Relu/Clip-into-Q fusion) drop a "
    "Relu in front of an FP8 QuantizeLinear as if FP8's zero point 0 were the type's minimum, "
    "and negative values pass (ppocr_mobile_v2_cls: accuracy 0.88 instead of 1.00), and fail "
    "to load a model with a Clip in front of one (mobilenet_v2's ReLU6); use "
    "GraphOptimizationLevel.ORT_ENABLE_BASIC or ORT_DISABLE_ALL (onnxq does not compare the "
    "default session's outputs for FP8)"
)
FP8_CHANGES: dict[str, object] = {
    "min_opset": 19,
    "min_conv_channels": 16,
    "max_conv_kernel_area": 32,
    "validation_note": FP8_VALIDATION_NOTE,
    "compare_default_session": False,
}

TENSORRT_INT16_REFUSAL = (
    "TensorRT's Q/DQ layers take INT8, FP8 and INT4 only (its ONNX parser rejects any other "
    "QuantizeLinear type); use --precision int8 or fp8, or --backend onnxruntime for 16-bit "
    "activations"
)
TENSORRT_DYNAMIC_REFUSAL = (
    "TensorRT has no run-time (dynamic) quantization of ONNX models: its ONNX parser rejects "
    "DynamicQuantizeLinear and MatMulInteger; use static quantization (--calib DATA) for "
    "TensorRT, or --backend onnxruntime --dynamic for onnxruntime on CPU"
)
TENSORRT_RECURRENT_REASON = (
    "TensorRT runs LSTM/GRU/RNN layers in FP32/FP16/BF16 only (its ONNX parser's operator "
    "table): Q/DQ around the cell would buy no INT8 kernel, so it stays float"
)

# ------------------------------------------------------------------------------ onnxruntime
ONNXRUNTIME_FP8_REFUSAL = (
    "onnxruntime's CPU execution provider runs FP8 QuantizeLinear/DequantizeLinear but has no "
    "FP8 Conv/MatMul kernels: every op would compute in float after a DequantizeLinear, slower "
    "than the float model; FP8 is for TensorRT on Ada/Hopper/Blackwell GPUs (--backend "
    "tensorrt --precision fp8)"
)
ONNXRUNTIME_RECURRENT_REASON = (
    "onnxruntime has no static-INT8 kernel for LSTM/GRU/RNN (Q/DQ around the cell would run "
    "dequantized in float); an LSTM gets onnxruntime's DynamicQuantizeLSTM under --dynamic"
)
DYNAMIC_RECURRENT_REASON = (
    "onnxruntime has a dynamically quantized kernel for LSTM only (DynamicQuantizeLSTM): "
    "GRU and RNN stay float"
)
DYNAMIC_CONV_REASON = (
    "onnxruntime's dynamically quantized conv (DynamicQuantizeLinear + ConvInteger) runs "
    "1.2-4.2x slower than the float Conv on x86 (measured, docs/precisions.md): it stays float"
)

# A --dynamic run on onnxruntime: the "dynamic" rule set (MatMul/Gemm with a constant weight,
# LSTM), weights int8 per channel, activations quantized by the kernels at run time, bias kept
# float (the kernels add it), fidelity measured in onnxruntime's default session.
# DynamicQuantizeMatMul measured against float MatMul (1 thread): 0.2-0.95x the time from
# K = N = 64 up, 1.1-1.7x at K = N = 16-32, hence min_channels.
ONNXRUNTIME_DYNAMIC_CHANGES: dict[str, object] = {
    "rule_set": "dynamic",
    "dynamic": True,
    # DynamicQuantizeMatMul / MatMulIntegerToFloat take u8 x s8 (7-bit weights where that
    # saturates), never the uint8-stored weights of the static kernels
    "stored_weight_dtypes": frozenset({"int8"}),
    "quantize_outputs": False,
    "bias": "float",
    "min_channels": 64,
    "min_macs": 0,
    "min_macs_per_output": 0,
    "min_macs_per_output_unaligned": 0,
    "head_method": None,
    "output_method": None,
    "fused_validation": True,
    "integer_kernel_ops": frozenset({"MatMul", "Gemm", "LSTM"}),
    # the Linear biases the kernels take in leave each residual Add + LayerNorm to onnxruntime's
    # SkipLayerNormalization fusion, whose CPU kernel is slower than the two ops it replaces
    "residual_sums": True,
    "float_op_reasons": {
        **dict.fromkeys(("GRU", "RNN"), DYNAMIC_RECURRENT_REASON),
        "Conv": DYNAMIC_CONV_REASON,
    },
}
