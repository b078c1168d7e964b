"""Backend profiles: what each backend requires and rewards, as data.

Nothing outside ``onnxq/backends`` branches on a backend's name: rules, materialize and the
checker read these fields.  Sources for every fact: ``BACKENDS.md`` in the design notes
(TensorRT's ONNX parser, NVIDIA's explicit-quantization guide, onnxruntime's QDQ fusions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxq.backends.precision_facts import (  # FP8, INT16, dynamic, recurrent cells
    FP8_CHANGES,
    ONNXRUNTIME_DYNAMIC_CHANGES,
    ONNXRUNTIME_FP8_REFUSAL,
    ONNXRUNTIME_RECURRENT_REASON,
    RECURRENT_OPS,
    TENSORRT_DYNAMIC_REFUSAL,
    TENSORRT_INT16_REFUSAL,
    TENSORRT_RECURRENT_REASON,
)
from onnxq.backends.weight_only_format import WeightOnlyFormat
from onnxq.ir.constants import INTEGER_OPS, WEIGHT_ONLY_OPS
from onnxq.ir.ops import PASSTHROUGH_OPS, SHAPE_OPS, WEIGHT_AXES, WeightAxis


@dataclass(frozen=True)
class BackendProfile:
    """Everything onnxq needs to know about one backend.

    Attributes:
        name: the ``--backend`` value.
        activation_dtype: ``int8`` or ``uint8`` for activations.
        activation_symmetric: zero point fixed at 0 (TensorRT requires it).
        weight_qmax: largest int8 weight magnitude (127; 63 where 7-bit weights avoid the
            int16 saturation of onnxruntime's u8s8 kernels on CPUs without VNNI).
        weight_dtype: the element type weights are stored in: ``int8`` (zero point 0), or
            ``uint8``, the same values + 128 behind zero point 128 (onnxruntime on a CPU
            class whose u8 x u8 kernels are exact where its u8 x s8 ones saturate:
            ``onnxq.backends.cpu``).
        weight_axes: per-op weight channel axis.
        rule_set: name of the ordered rule set in ``onnxq.place.rules.sets`` to place Q/DQ.
        quantize_outputs: whether quantized ops also get Q/DQ on their outputs (onnxruntime
            needs DQ -> op -> Q groups to fuse an integer kernel; TensorRT does not want it).
        bias: ``float`` (TensorRT fuses float bias) or ``int32`` (scale = input x weight scale).
        min_opset: the lowest opset the output may have (13: per-axis Q/DQ).
        forbidden_ops: op types the backend's parser rejects in a Q/DQ model.
        allowed_qdq_dtypes: element types a Q/DQ node may produce or read.
        stored_weight_dtypes: element types the backend's integer kernels take int8-valued
            weights in (a CPU class's ``weight_dtype`` is used only where listed here).
        per_axis_activations: whether per-axis scales are allowed on non-constant tensors.
        min_channels: Conv/Gemm/MatMul with fewer input or output channels stay float.
        grouped_channel_multiple, grouped_min_kernel: with that small-op rule on
            (``min_channels`` > 0, the profile's or the config's), a grouped conv takes INT8
            only when its output channels are a multiple of the first and its smallest kernel
            side at least the second: TensorRT's figures (8 and 3; ModelOpt skips the others,
            ``BACKENDS.md``), which an onnxruntime run applies too when its config turns the
            small-op rule on.
        residual_producers: the weighted ops whose output a residual Add may read for the
            ``residual_add`` rule to put Q/DQ on its other (skip) input: TensorRT fuses that
            Add into the epilogue of a Conv or ConvTranspose, and ModelOpt's ONNX placement
            treats only those as a residual's backbone (docs/backends.md).  A MatMul/Gemm's
            Add is a transformer's residual stream, whose per-channel outliers one
            per-tensor scale cannot carry (SmolLM2-135M W8A8: proxy perplexity 59.6 with its
            skip input quantized, 20.56 without, float 19.09; docs/recovery.md); it stays float.
        long_conv_reduction: with the small-op rule on, a group-1 Conv that sums at least
            this many products per output (input channels x kernel area, the K of the GEMM it
            runs as) takes INT8 whatever its channel counts: a 1-channel STFT conv with a
            256-tap kernel, a 128 -> 1 channel output conv.  ``0``: no exception.  TensorRT's
            128: the zoo's convs with shorter reductions lost accuracy in INT8 (a 3-channel
            3x3 stem, K = 27; a 10-channel 3x3 conv, K = 90; a 32 -> 4 box head, K = 32),
            and ModelOpt's INT8 exception (a channel count a multiple of 8) would take those.
        output_method: the range method that ``auto`` means for Q/DQ on an op's raw output (the
            requantization of an integer kernel, not a folded ReLU/Clip): clipping there
            saturates the outliers the next op (hardswish, sigmoid, add) still needs, so
            onnxruntime's raw outputs use ``robust_minmax``: ``minmax``, unless a few
            outliers dominate the range (max |x| > 2.5x the 99.99th percentile; ISNet's and
            magika's conv outputs, none of the zoo's).
        head_method: the range method that ``auto`` means for the activation inputs of a
            model's heads (:func:`onnxq.place.heads.head_nodes`: the weighted ops an output is read
            from through data movement, a constant bias and Sigmoid/Softmax only).  Their
            outputs (scores, boxes, logits) are read at their extremes and no later layer
            averages a clipped input out.  A model whose outputs are per-element sigmoid
            scores (:func:`onnxq.place.heads.score_maps`: detectors, segmentation maps) gets it
            for every activation: on YOLOv8n, YOLOX and PP-OCRv4 det, clipping anywhere moved
            the scores (git: docs/benchmarks.md).  ``None``: no special case.
        folded_activations: activations right after a weighted op that the backend drops when
            the output Q's range already clips (onnxruntime's ReluQuantFusion and
            ClipQuantFusion): the Q/DQ goes after them.
        float_readers: op types that read an op's quantized output as the float tensor, not
            through a DequantizeLinear: onnxruntime fuses DQ -> Softmax -> Q into QLinearSoftmax,
            which returns 0 instead of 1 over an axis of size 1 (onnxruntime 1.31, found by
            fuzzing), so no Softmax is ever put between Q/DQ pairs.
        integer_kernel_ops: ops the backend runs as integer kernels when wrapped in DQ -> op -> Q
            (what ``onnxq check`` counts as fusable groups).
        unary_kernel_ops: the single-input ops among them that the ``unary`` rule quantizes
            (input and output Q/DQ); the others have rules of their own (conv, binary,
            concat, passthrough) or none.
        float_output_kernel_ops: weighted ops that still fuse when their output stays float
            (onnxruntime: Gemm -> QGemm, MatMul -> MatMulIntegerToFloat); with
            ``quantize_outputs``, other weighted ops whose
            output cannot be quantized (a graph output) stay float.
        reduced_weight_qmax: weight magnitude limit used instead of ``weight_qmax`` when the
            config asks for reduced range, or (``reduce_range`` unset) the CPU lacks int8 dot
            products; ``None``: the backend never reduces.
        fused_validation: whether fidelity is measured with onnxruntime's Q/DQ fusion on (the
            kernels the user will run) or off (the graph's own arithmetic, what TensorRT runs).
        float_grouped_convs: grouped (depthwise) convs get int8 only inside a chain of integer
            kernels: onnxruntime's x86 int8 depthwise kernel runs 1.4-10x slower than float.
        min_macs_per_output: a Conv/Gemm/MatMul summing fewer products per output element
            (input channels per group x kernel area; K) gets int8 only inside a chain of integer
            kernels (``onnxq.place.rules.cost``): onnxruntime's x86 depthwise and few-channel int8
            convs run slower than float.  0: off.
        channel_alignment: the input channels per group the integer conv kernel takes in one
            step; a conv over a count that is not a multiple of it is "unaligned".  0: none.
        min_macs_per_output_unaligned: the same threshold for a conv with a kernel larger than
            1x1 over unaligned input channels: onnxruntime's int8 kernel runs a 3x3 conv over
            10 channels at 0.9-1.2x float, over 12 at 1.7-2.7x (git: docs/benchmarks.md, Latency,
            session 9).  0: off.
        min_macs: the same for an op with fewer multiply-adds per sample (static shapes only):
            its Q/DQ nodes would cost more than it saves.  0: off.
        chain_ops: ops quantized only when every activation input comes quantized out of an
            integer kernel (their int8 kernel saves nothing by itself).
        nhwc_only_ops: ops onnxruntime runs in uint8 when a Q follows them (it moves the Q
            backward through them) but fast only inside the NHWC layout of its integer convs; an
            op below the cost thresholds whose output reaches one keeps int8.
        cpu_tuned: the output depends on the CPU class it targets (weight range, cost
            thresholds: ``onnxq.backends.target``); a profile without it gives the same output
            on every machine.
        int32_depthwise: the depthwise (one channel per group) int8 conv kernel sums in int32
            on every CPU, so a reduced weight range never applies to it (onnxruntime: u8 255 x
            s8 127 comes out exact under ``qemu-x86_64 -cpu Haswell``, where its Conv, Gemm and
            MatMul kernels saturate).
        target_cpu: the CPU class the profile was tuned for (``None``: not ``cpu_tuned``).
        cost_table: where the cost thresholds come from (the table's measurement).
        depthwise_weight_qmax: the weight limit of a depthwise conv where it differs from
            ``weight_qmax`` (set with the reduced range and ``int32_depthwise``).
        precisions: the precisions (``onnxq.numerics.precisions``) the backend runs, each with the
            profile fields a run of that precision changes (FP8: opset 19, the convs
            TensorRT's FP8 kernels take); :func:`onnxq.backends.target.profile_for`.
        precision_refusals: why the backend cannot run the other precisions (the error text).
        dynamic_changes: the profile fields of a ``--dynamic`` run (None: the backend has no
            dynamic quantization; ``dynamic_refusal`` says why).
        dynamic: this profile quantizes activations at run time (no calibration; materialize
            writes onnxruntime's dynamic kernels instead of Q/DQ pairs).
        min_conv_channels: a Conv with this many or fewer output channels or input channels
            per group stays float (FP8: TensorRT's FP8 conv kernels lose to FP16 there).
        max_conv_kernel_area: a Conv whose kernel area (kh x kw) passes it stays float
            (TensorRT's FP8 conv kernels take filters of at most 32 elements).  0: no limit.
        float_op_reasons: op type -> why it stays float on this backend (recurrent cells).
        validation_note: what the report says about checking this profile's output in
            onnxruntime (FP8: which session settings compute it right).
        compare_default_session: an output validated unfused is also run in onnxruntime's
            default (fused) session and compared (``onnxq.backends.default_session``); off
            where that session computes the profile's Q/DQ wrong (FP8, ``validation_note``).
        weight_only: how weight-only layers are written and what they may be
            (:class:`WeightOnlyFormat`).
        residual_sums: an Add of two activations that only a LayerNormalization reads is
            written as Sum, which onnxruntime does not fuse into its SkipLayerNormalization
            (a scalar CPU kernel, 4-5x the time of the two ops: ``onnxq.place.rules.residual_sum``).
        strong_typing: the backend takes its precisions from the ONNX tensor types (TensorRT
            11's strongly typed networks): the checker also runs the typing rules
            (``onnxq.backends.typing_rules``).
        high_precision: what a run's float compute is written in when the config does not
            say (``high_precision``): ``fp16`` where the graph's types are the precisions
            (TensorRT 11), ``fp32`` for onnxruntime's CPU kernels (``onnxq.place.precision``).
    """

    name: str
    activation_dtype: str
    activation_symmetric: bool
    weight_qmax: int = 127
    weight_dtype: str = "int8"
    weight_axes: dict[str, WeightAxis] = field(default_factory=lambda: dict(WEIGHT_AXES))
    rule_set: str = "tensorrt"
    quantize_outputs: bool = False
    bias: str = "float"
    min_opset: int = 13
    forbidden_ops: frozenset[str] = frozenset()
    allowed_qdq_dtypes: frozenset[str] = frozenset({"int8"})
    stored_weight_dtypes: frozenset[str] = frozenset({"int8"})
    per_axis_activations: bool = False
    fused_validation: bool = False
    min_channels: int = 0
    grouped_channel_multiple: int = 8
    grouped_min_kernel: int = 3
    long_conv_reduction: int = 0
    residual_producers: frozenset[str] = frozenset()
    reduced_weight_qmax: int | None = None
    integer_kernel_ops: frozenset[str] = frozenset()
    unary_kernel_ops: frozenset[str] = frozenset()
    output_method: str | None = None
    head_method: str | None = "minmax"
    folded_activations: frozenset[str] = frozenset()
    float_readers: frozenset[str] = frozenset()
    float_output_kernel_ops: frozenset[str] = frozenset()
    float_grouped_convs: bool = False
    min_macs_per_output: int = 0
    channel_alignment: int = 0
    min_macs_per_output_unaligned: int = 0
    min_macs: int = 0
    chain_ops: frozenset[str] = frozenset()
    nhwc_only_ops: frozenset[str] = frozenset()
    passthrough_ops: frozenset[str] = PASSTHROUGH_OPS
    shape_ops: frozenset[str] = SHAPE_OPS
    cpu_tuned: bool = False
    int32_depthwise: bool = False
    target_cpu: str | None = None
    cost_table: str = ""
    depthwise_weight_qmax: int | None = None
    precisions: dict[str, dict[str, object]] = field(default_factory=lambda: {"int8": {}})
    precision_refusals: dict[str, str] = field(default_factory=dict)
    dynamic_changes: dict[str, object] | None = None
    dynamic_refusal: str = ""
    dynamic: bool = False
    min_conv_channels: int = 0
    max_conv_kernel_area: int = 0
    float_op_reasons: dict[str, str] = field(default_factory=dict)
    validation_note: str = ""
    compare_default_session: bool = True
    weight_only: WeightOnlyFormat | None = None
    residual_sums: bool = False
    strong_typing: bool = False
    high_precision: str = "fp32"

    def replace(self, **changes: object) -> BackendProfile:
        """A copy with some fields changed."""
        import dataclasses

        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


TENSORRT = BackendProfile(
    name="tensorrt",
    activation_dtype="int8",
    activation_symmetric=True,
    rule_set="tensorrt",
    quantize_outputs=False,
    bias="float",
    forbidden_ops=INTEGER_OPS
    | WEIGHT_ONLY_OPS
    | frozenset(
        {
            "QLinearConv",
            "QLinearMatMul",
            "QLinearAdd",
            "QLinearMul",
            "QLinearConcat",
            "QLinearGlobalAveragePool",
            "QLinearAveragePool",
            "QLinearSigmoid",
            "QLinearLeakyRelu",
            "QLinearSoftmax",
            "QLinearReduceMean",
            "QLinearWhere",
            "QLinearConvTranspose",
        }
    ),
    allowed_qdq_dtypes=frozenset({"int8", "float8e4m3fn"}),
    fused_validation=False,
    min_channels=16,
    long_conv_reduction=128,
    residual_producers=frozenset({"Conv", "ConvTranspose"}),
    precisions={"int8": {}, "fp8": FP8_CHANGES},
    precision_refusals={"int16": TENSORRT_INT16_REFUSAL},
    dynamic_refusal=TENSORRT_DYNAMIC_REFUSAL,
    float_op_reasons=dict.fromkeys(RECURRENT_OPS, TENSORRT_RECURRENT_REASON),
    strong_typing=True,
    high_precision="fp16",
    # TensorRT's IDequantizeLayer: block quantization for INT4 weights only, blocks of 64 or
    # 128 along one of the last two axes, a 2-D scale, zero points absent or 0 (TensorRT
    # docs, "Quantization Schemes"); int8 weights per channel
    weight_only=WeightOnlyFormat(
        writer="dequantize_linear",
        bits=frozenset({4, 8}),
        blocked_bits=frozenset({4}),
        symmetric_only=True,
        block_sizes=frozenset({64, 128}),
    ),
)

# QLinearGlobalAveragePool, QLinearAveragePool, QLinearSigmoid, QLinearLeakyRelu
_ORT_UNARY_KERNELS = frozenset({"GlobalAveragePool", "AveragePool", "Sigmoid", "LeakyRelu"})

ONNXRUNTIME = BackendProfile(
    name="onnxruntime",
    activation_dtype="uint8",
    activation_symmetric=False,
    rule_set="onnxruntime",
    quantize_outputs=True,
    bias="int32",
    reduced_weight_qmax=63,
    # Gemm -> QGemm; MatMul with a constant right-hand side -> MatMulIntegerToFloat (an LM
    # head of [768, 50257]: 3.9-6.0x faster than float here, git: docs/benchmarks.md)
    float_output_kernel_ops=frozenset({"Gemm", "MatMul"}),
    output_method="robust_minmax",
    folded_activations=frozenset({"Relu", "Clip"}),
    float_readers=frozenset({"Softmax"}),
    # no ConvTranspose: onnxruntime 1.31's CPU provider leaves DQ -> ConvTranspose -> Q unfused
    # (a float ConvTranspose between a DQ and a Q; found on a 1-D segmentation net and a ViT
    # decoder)
    integer_kernel_ops=frozenset(
        [
            "Conv",
            "MatMul",
            "Gemm",
            "Add",
            "Mul",
            "Concat",
            "MaxPool",
            "Reshape",
            "Transpose",
            "Resize",
            "Squeeze",
            "Unsqueeze",
            "Flatten",
            "Gather",
            "Split",
            "Where",
        ]
    )
    | _ORT_UNARY_KERNELS,
    unary_kernel_ops=_ORT_UNARY_KERNELS,
    allowed_qdq_dtypes=frozenset({"int8", "uint8", "int16", "uint16", "int32"}),
    stored_weight_dtypes=frozenset({"int8", "uint8"}),
    fused_validation=True,
    float_grouped_convs=True,
    min_macs_per_output=32,
    channel_alignment=4,
    min_macs_per_output_unaligned=96,
    min_macs=65536,
    chain_ops=frozenset(
        {"Add", "Mul", "Concat", "GlobalAveragePool", "AveragePool", "Sigmoid", "LeakyRelu"}
    ),
    nhwc_only_ops=frozenset({"MaxPool"}),
    cpu_tuned=True,
    int32_depthwise=True,
    precisions={"int8": {}, "int16": {}},
    precision_refusals={"fp8": ONNXRUNTIME_FP8_REFUSAL},
    dynamic_changes=ONNXRUNTIME_DYNAMIC_CHANGES,
    float_op_reasons=dict.fromkeys(RECURRENT_OPS, ONNXRUNTIME_RECURRENT_REASON),
    # MatMulNBits: blocks of a power of two >= 16 along K (a short last block is padded), 4 or
    # 8 bits, symmetric (default zero point) or integer zero points; GatherBlockQuantized for
    # embedding tables
    weight_only=WeightOnlyFormat(
        writer="matmul_nbits",
        bits=frozenset({4, 8}),
        blocked_bits=frozenset({4, 8}),
        symmetric_only=False,
        embedding_ops=frozenset({"Gather"}),
    ),
)

PROFILES: dict[str, BackendProfile] = {p.name: p for p in (TENSORRT, ONNXRUNTIME)}
BACKENDS: tuple[str, ...] = tuple(PROFILES)  # the --backend values
