"""The dynamic rule set: which ops get onnxruntime's dynamic kernels, and why others stay float."""

from __future__ import annotations

import numpy as np

from onnxq import ir
from onnxq.backends.profile import ONNXRUNTIME, TENSORRT
from onnxq.config import QuantConfig
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from tests import graphs

BASE = {"backend": "onnxruntime", "dynamic": True, "target_cpu": "x86-vnni"}
CFG = QuantConfig(**BASE)
DYNAMIC = CFG.backend_profile()[0]


def decisions(model, profile=DYNAMIC, config=CFG):
    graph = ir.Graph(ir.infer_shapes(model))
    ann = annotate(GraphFacts.of(graph, profile), profile, config.placement)
    return {d.node: d for d in ann.decisions}, ann


def test_matmuls_with_a_constant_weight_are_claimed_and_attention_scores_are_not():
    found, ann = decisions(graphs.matmul_stack())
    assert found["up"].rule == found["down"].rule == "dynamic_matmul"
    assert not found["scores"].quantized and "activation x activation" in found["scores"].reason
    assert {t.tensor for t in ann.of_kind("weight")} == {"w1", "w2"}
    # Gaussian weights keep ~40 dB under one scale: auto gives them one
    assert {t.axis for t in ann.of_kind("weight")} == {None}
    channel = QuantConfig(**{**BASE, "dynamic_weight_scales": "channel"})
    _, ann = decisions(graphs.matmul_stack(), config=channel)
    assert {t.axis for t in ann.of_kind("weight")} == {1}  # per output column


def weight_axes(model, config=CFG, profile=DYNAMIC):
    _, ann = decisions(model, profile, config)
    return {t.tensor: t.axis for t in ann.of_kind("weight")}


def with_weight(model, name, value):
    from onnx import numpy_helper

    t = next(t for t in model.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    return model


def test_auto_keeps_per_column_scales_where_one_scale_would_round_the_weight_away():
    m = graphs.matmul_stack()
    loud = graphs.weight(graphs.rng(5), 128, 256)
    loud[:, :8] *= 30  # a few loud columns: one scale leaves the rest a few levels
    assert weight_axes(with_weight(m, "w1", loud)) == {"w1": 1, "w2": None}
    tensor = QuantConfig(**{**BASE, "dynamic_weight_scales": "tensor"})
    assert weight_axes(with_weight(m, "w1", loud), tensor) == {"w1": None, "w2": None}


def test_the_threshold_counts_the_weight_range_of_the_target_cpu():
    # one value of 1 among +-0.1: ~33 dB under one scale at 8 bits, ~27 dB at the 7 bits an
    # x86-avx2 target's kernels get
    w = np.where(graphs.rng(2).random((128, 256)) < 0.5, -0.1, 0.1).astype(np.float32)
    w[0, 0] = 1.0
    m = with_weight(graphs.matmul_stack(), "w1", w)
    assert weight_axes(m)["w1"] is None
    avx2 = QuantConfig(**{**BASE, "target_cpu": "x86-avx2"})
    assert weight_axes(m, avx2, avx2.backend_profile()[0])["w1"] == 1


def test_the_up_projection_whose_outlier_columns_are_divided_keeps_per_column_scales():
    tensor = QuantConfig(**{**BASE, "dynamic_weight_scales": "tensor"})
    axes = weight_axes(graphs.swiglu(outliers=(3, 17, 200)), tensor)
    assert axes == {"wg": None, "wu": 1, "wd": None}
    # without outlier channels nothing is divided: the up projection gets one scale too
    assert set(weight_axes(graphs.swiglu(), tensor).values()) == {None}


def test_an_override_gives_a_weight_one_scale_in_channel_mode():
    from onnxq.config.overrides import Override

    channel = QuantConfig(
        **{**BASE, "dynamic_weight_scales": "channel"},
        overrides=(Override(node="down", per_channel=False),),
    )
    assert weight_axes(graphs.matmul_stack(), channel) == {"w1": 1, "w2": None}


def test_a_gated_linear_units_output_goes_to_the_gated_rule_and_a_sum_does_not():
    found, _ = decisions(graphs.swiglu())
    assert found["gate"].quantized and found["up"].quantized
    assert found["down"].rule == "dynamic_gated_matmul"
    found, _ = decisions(graphs.swiglu(gate_op="Add"))  # a sum of two activations is no product
    assert found["down"].rule == "dynamic_matmul"


def test_a_gated_product_of_graph_inputs_stays_float_with_the_reason():
    from onnx import helper

    nodes = [
        helper.make_node("Mul", ["a", "b"], ["h"], name="glu"),
        helper.make_node("MatMul", ["h", "wd"], ["y"], name="down"),
    ]
    model = graphs.model(
        nodes,
        [graphs.tensor("a", [2, 256]), graphs.tensor("b", [2, 256])],
        [graphs.tensor("y", [2, 128])],
        [graphs.init("wd", graphs.weight(graphs.rng(0), 256, 128))],
    )
    found, _ = decisions(model)
    assert not found["down"].quantized and "gated linear unit" in found["down"].reason
    assert found["down"].rule == "dynamic_matmul"  # the closest rule's reason


def test_a_decomposed_gelus_output_is_not_a_gated_product():
    from onnx import helper

    r = graphs.rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"], name="div"),
        helper.make_node("Erf", ["hs"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="add"),
        helper.make_node("Mul", ["e1", "half"], ["gate"], name="half_gate"),
        helper.make_node("Mul", ["h", "gate"], ["g"], name="gelu"),
        helper.make_node("MatMul", ["g", "w2"], ["y"], name="down"),
    ]
    inits = [
        graphs.init("w1", graphs.weight(r, 128, 256)),
        graphs.init("w2", graphs.weight(r, 256, 128)),
        *(
            graphs.init(n, np.array(v, np.float32))
            for n, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))
        ),
    ]
    model = graphs.model(
        nodes, [graphs.tensor("x", [2, 8, 128])], [graphs.tensor("y", [2, 8, 128])], inits
    )
    found, _ = decisions(model)
    assert found["down"].quantized


def linear(excluded: tuple[str, ...] = ()):
    """x -> MatMul(W [128, 64]) -> Add(b [64]) -> y: a Linear layer as exporters write it."""
    from onnx import helper

    r = graphs.rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="fc"),
        helper.make_node("Add", ["xw", "b"], ["y"], name="bias"),
    ]
    inits = [graphs.init("w", graphs.weight(r, 128, 64)), graphs.init("b", graphs.weight(r, 64))]
    model = graphs.model(
        nodes, [graphs.tensor("x", [2, 128])], [graphs.tensor("y", [2, 64])], inits
    )
    return decisions(model, config=CFG.replace(exclude=excluded))[0]


def test_a_linear_layers_bias_add_is_folded_into_the_kernel_unless_excluded():
    found = linear()
    assert found["fc"].rule == "dynamic_matmul"
    assert found["bias"].rule == "fused" and "into fc's kernel" in found["bias"].reason
    found = linear(excluded=("bias",))
    assert found["fc"].quantized and not found["bias"].quantized


def test_a_small_weight_stays_float_with_the_cost_reason():
    found, _ = decisions(graphs.matmul_stack(k=32, n=32))
    assert not found["up"].quantized
    assert "costs more than it saves" in found["up"].reason


def test_gemm_with_a_per_column_bias_is_claimed():
    found, _ = decisions(graphs.gemm(trans_b=True, k=128, n=64))
    assert found["gemm"].rule == "dynamic_gemm"


def test_an_lstm_is_claimed_and_gru_and_rnn_stay_float_with_the_reason():
    found, ann = decisions(graphs.recurrent("LSTM"))
    assert found["rnn"].rule == "dynamic_lstm"
    assert {t.tensor: t.axis for t in ann.of_kind("weight")}["rnn.R"] == 1
    for cell in ("GRU", "RNN"):
        found, _ = decisions(graphs.recurrent(cell))
        assert not found["rnn"].quantized
        assert "DynamicQuantizeLSTM" in found["rnn"].reason and "GRU and RNN" in found["rnn"].reason
        assert found["fc"].quantized  # the cell stays float, its neighbours do not


def test_a_small_lstm_stays_float():
    found, _ = decisions(graphs.recurrent("LSTM", features=32, hidden=32))
    assert not found["rnn"].quantized and "so small a cell" in found["rnn"].reason
    found, _ = decisions(graphs.recurrent("LSTM", steps=1))  # one step: still quantized
    assert found["rnn"].quantized


def test_a_conv_stays_float_with_the_measured_reason():
    found, _ = decisions(graphs.conv_relu(64, 64))
    assert not found["conv"].quantized and "ConvInteger" in found["conv"].reason


def test_static_backends_say_why_recurrent_cells_stay_float():
    for profile, backend, text in (
        (TENSORRT, "tensorrt", "FP32/FP16/BF16 only"),
        (ONNXRUNTIME, "onnxruntime", "DynamicQuantizeLSTM under --dynamic"),
    ):
        found, _ = decisions(graphs.recurrent("GRU"), profile, QuantConfig(backend=backend))
        assert not found["rnn"].quantized and text in found["rnn"].reason
