"""The onnxruntime profile's cost rules (onnxq.place.rules.cost): where int8 does not pay, ops stay
float unless they sit inside a chain of integer kernels; TensorRT placement is unaffected."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.place.annotations import Annotations
from tests import graphs
from tests.placement import annotate_graph


def net(layers: list[tuple], shape: tuple[int, ...] = (1, 16, 16, 16)) -> onnx.ModelProto:
    """A chain of layers named l0, l1, ...; the last output feeds a Tanh tail (no integer kernel)
    so that it is not a graph output.

    ``("conv", out_channels, kernel, group)``, ``("gemm", n)``, ``("op", op_type)``.
    """
    r = graphs.rng(0)
    nodes, inits, x, dims = [], [], "x", list(shape)
    for i, layer in enumerate(layers):
        name, out = f"l{i}", f"t{i}"
        if layer[0] == "conv":
            _, out_c, k, group = layer
            w = graphs.weight(r, out_c, dims[1] // group, k, k)
            b = graphs.weight(r, out_c)
            inits += [graphs.init(f"{name}.w", w), graphs.init(f"{name}.b", b)]
            nodes.append(
                helper.make_node(
                    "Conv",
                    [x, f"{name}.w", f"{name}.b"],
                    [out],
                    name=name,
                    group=group,
                    pads=[k // 2] * 4,
                )
            )
            dims[1] = out_c
        elif layer[0] == "gemm":
            w = graphs.weight(r, layer[1], dims[1])
            inits.append(graphs.init(f"{name}.w", w))
            nodes.append(helper.make_node("Gemm", [x, f"{name}.w"], [out], name=name, transB=1))
            dims[1] = layer[1]
        elif layer[1] == "MaxPool":
            nodes.append(
                helper.make_node(
                    "MaxPool", [x], [out], name=name, kernel_shape=[2, 2], strides=[2, 2]
                )
            )
            dims[2:] = [d // 2 for d in dims[2:]]
        else:
            nodes.append(helper.make_node(layer[1], [x], [out], name=name))
        x = out
    nodes.append(helper.make_node("Tanh", [x], ["y"], name="tail"))
    return graphs.model(nodes, [graphs.tensor("x", list(shape))], [graphs.tensor("y", dims)], inits)


def annotated(model: onnx.ModelProto, backend: str = "onnxruntime") -> Annotations:
    graph = ir.Graph(ir.infer_shapes(model))
    return annotate_graph(graph, PROFILES[backend])


def decision(ann: Annotations, node: str):
    (found,) = [d for d in ann.decisions if d.node == node]
    return found


def quantized(ann: Annotations) -> list[str]:
    return [d.node for d in ann.decisions if d.quantized and d.rule != "fused"]


SEPARABLE = [
    ("conv", 32, 3, 1),
    ("op", "Relu"),
    ("conv", 32, 3, 32),
    ("op", "Relu"),
    ("conv", 32, 1, 1),
    ("op", "Relu"),
]


# ------------------------------------------------------------------------------- grouped convs
def test_depthwise_conv_inside_a_chain_of_integer_kernels_is_quantized():
    ann = annotated(net(SEPARABLE))
    assert quantized(ann) == ["l0", "l2", "l4"]


def test_depthwise_conv_on_a_float_input_stays_float():
    ann = annotated(net(SEPARABLE[2:], shape=(1, 32, 16, 16)))  # reads the graph input
    d = decision(ann, "l0")
    assert not d.quantized and d.rule == "conv"
    assert "grouped conv" in d.reason and "slower than float" in d.reason
    assert quantized(ann) == ["l2"]  # the pointwise conv after it starts the chain


def test_depthwise_conv_that_would_end_the_chain_stays_float():
    layers = [*SEPARABLE[:2], ("conv", 32, 3, 32), ("op", "Tanh"), ("conv", 32, 1, 1)]
    ann = annotated(net(layers))
    d = decision(ann, "l2")
    assert not d.quantized and "no reader continues the chain" in d.reason
    assert quantized(ann) == ["l0", "l4"]


def test_grouped_conv_placement_is_unchanged_for_tensorrt():
    ann = annotated(net(SEPARABLE[2:], shape=(1, 32, 16, 16)), "tensorrt")
    assert decision(ann, "l0").quantized


# ------------------------------------------------------------------------------- few products
def test_conv_with_few_products_per_output_stays_float():
    ann = annotated(
        net([("conv", 32, 3, 1), ("op", "Tanh"), ("conv", 32, 3, 1)], shape=(1, 3, 16, 16))
    )
    d = decision(ann, "l0")  # 3 channels x 3 x 3 = 27 products per output
    assert not d.quantized
    assert "27 multiply-adds per output element (< min_macs_per_output=32)" in d.reason
    assert quantized(ann) == ["l2"]


def test_conv_with_few_products_keeps_int8_when_a_maxpool_follows():
    # onnxruntime would run that MaxPool on uint8 outside its NHWC layout (10x slower than float)
    ann = annotated(
        net(
            [("conv", 32, 3, 1), ("op", "Tanh"), ("op", "MaxPool"), ("conv", 32, 3, 1)],
            shape=(1, 3, 16, 16),
        )
    )
    assert decision(ann, "l0").quantized


def test_a_maxpool_keeps_the_conv_before_it_int8_only_for_a_conv_after_it_that_pays():
    # MTCNN P-Net: 3 -> 10 channels, MaxPool, a 3x3 conv over the 10 (90 unaligned products):
    # no Q follows the pool, so int8 for the first conv would only cost (3.5x its float time)
    ann = annotated(
        net(
            [
                ("conv", 10, 3, 1),
                ("op", "Tanh"),
                ("op", "MaxPool"),
                ("conv", 16, 3, 1),
                ("op", "Tanh"),
                ("conv", 32, 3, 1),
            ],
            shape=(1, 3, 64, 64),
        )
    )
    assert quantized(ann) == ["l5"]
    d = decision(ann, "l3")
    assert not d.quantized
    assert (
        "90 multiply-adds per output element over input channels that are not a multiple "
        "of 4 (< min_macs_per_output_unaligned=96)"
    ) in d.reason
    # 12 channels after the pool (108 aligned products): the pool's output is quantized for it
    ann = annotated(
        net(
            [
                ("conv", 12, 3, 1),
                ("op", "Tanh"),
                ("op", "MaxPool"),
                ("conv", 16, 3, 1),
                ("op", "Tanh"),
                ("conv", 32, 3, 1),
            ],
            shape=(1, 3, 64, 64),
        )
    )
    assert quantized(ann) == ["l0", "l3", "l5"]


@pytest.mark.parametrize(
    "channels, kernel, expected",
    [
        (10, 3, False),  # 90 products over 10 channels: 0.9-1.2x float
        (11, 3, True),  # 99: from min_macs_per_output_unaligned on
        (8, 3, True),  # 72 products over 8 channels (aligned): 1.2-2.2x
        (3, 7, True),  # a 7x7 stem over RGB: 147 products
        (3, 5, False),  # 75: 0.7x
        (30, 1, False),  # a 1x1 conv is not unaligned, but 30 < min_macs_per_output
        (33, 1, True),
    ],
)
def test_the_unaligned_threshold_applies_to_spatial_convs(channels, kernel, expected):
    ann = annotated(net([("conv", 32, kernel, 1), ("op", "Tanh")], shape=(1, channels, 32, 32)))
    assert decision(ann, "l0").quantized is expected


def test_the_threshold_is_profile_data():
    model = net([("conv", 32, 3, 1), ("op", "Tanh"), ("conv", 32, 3, 1)], shape=(1, 3, 16, 16))
    graph = ir.Graph(ir.infer_shapes(model))
    profile = PROFILES["onnxruntime"].replace(
        min_macs_per_output=0, min_macs_per_output_unaligned=0
    )
    ann = annotate_graph(graph, profile, QuantConfig(backend="onnxruntime"))
    assert decision(ann, "l0").quantized


# ------------------------------------------------------------------------------- small ops
def test_small_gemm_stays_float_and_a_large_one_is_quantized():
    small = annotated(net([("gemm", 16), ("op", "Tanh")], shape=(1, 64)))
    d = decision(small, "l0")
    assert not d.quantized and "1024 multiply-adds per sample (< min_macs=65536)" in d.reason
    large = annotated(net([("gemm", 256), ("op", "Tanh")], shape=(1, 512)))
    assert decision(large, "l0").quantized


def test_the_size_of_a_matmul_behind_an_onnx_ml_scaler_is_known():
    # onnx's shape inference stops at the ai.onnx.ml Scaler; onnxq carries its shape on, so the
    # small MatMuls of a scikit-learn pipeline are sized and stay float
    ann = annotated(graphs.tabular(k=64, n=32))
    d = decision(ann, "pca")
    assert not d.quantized and "2048 multiply-adds per sample (< min_macs=65536)" in d.reason
    assert quantized(ann) == []
    assert "pca" in quantized(annotated(graphs.tabular(k=512, n=256)))


# ------------------------------------------------------------------------------- chain ops
def residual_into_conv() -> onnx.ModelProto:
    """residual_add (two convs joined by an Add) whose Add feeds one more conv -> Tanh."""
    model = graphs.residual_add(channels=32)
    graph = model.graph
    r = graphs.rng(9)
    out = graph.output[0].name
    inner = f"{out}_joined"
    for node in graph.node:
        node.output[:] = [inner if o == out else o for o in node.output]
    graph.initializer.append(graphs.init("conv3.w", graphs.weight(r, 32, 32, 3, 3)))
    graph.node.extend(
        [
            helper.make_node("Conv", [inner, "conv3.w"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
            helper.make_node("Tanh", ["c3"], [out], name="tail"),
        ]
    )
    return model


def test_add_of_two_integer_kernels_is_quantized_when_the_chain_goes_on():
    add = decision(annotated(residual_into_conv()), "add")
    assert add.quantized and add.rule == "binary"


def test_add_whose_output_no_integer_kernel_reads_stays_float():
    # Add -> Tanh -> output: its Q would be dequantized at once; int8 saves nothing
    add = decision(annotated(graphs.with_tail(graphs.residual_add(), "Tanh")), "add")
    assert not add.quantized
    assert "no reader of its output continues one" in add.reason


@pytest.mark.parametrize(
    "builder",
    [
        lambda: graphs.binary("Add"),
        lambda: graphs.binary("Mul"),
        graphs.concat,
        lambda: graphs.unary("Sigmoid"),
    ],
)
def test_chain_op_on_float_inputs_stays_float(builder):
    ann = annotated(builder())
    (d,) = [d for d in ann.decisions if d.node in ("binary", "concat", "unary")]
    assert not d.quantized
    assert "pays only inside a chain of integer kernels" in d.reason
    assert not ann.tensors


# ------------------------------------------------------------------------------- end to end
def test_qdq_count_and_onnxruntime_fuses_what_was_placed():
    from onnxq.backends.fusion import fusion_report

    model = net([*SEPARABLE, ("conv", 32, 3, 32), ("op", "Tanh")])
    result = onnxq.quantize(
        model, graphs.random_batches(model, 3), backend="onnxruntime", progress=False
    )
    out = result.model
    # x, and the three Relu outputs; the last depthwise conv ends the chain and stays float
    assert graphs.count_ops(out, "QuantizeLinear") == 4
    assert graphs.count_ops(out, "DequantizeLinear") == 4 + 3 + 3  # + weights + int32 biases
    report = fusion_report(out, PROFILES["onnxruntime"].integer_kernel_ops)
    assert report.ratio == 1.0 and not report.float_between
    # the float depthwise conv reads a DequantizeLinear but no Q follows it, so onnxruntime does
    # not quantize its weights on its own: three integer convs, not four
    assert report.integer_ops == {"QLinearConv": 3}
