"""Q/DQ insertion: weights, activations, int32 biases, rewiring only annotated consumers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.config import QuantConfig
from onnxq.materialize.qdq import materialize, read_metadata
from onnxq.numerics.qparams import quantize_weight, range_to_qparams, weight_qparams
from tests import graphs
from tests.placement import annotate_graph


def place(model: onnx.ModelProto, backend: str = "tensorrt", acts=None, **options):
    """Annotate and materialize ``model`` in place with fixed activation ranges [-4, 4]."""
    model = ir.infer_shapes(model)
    profile = PROFILES[backend]
    cfg = QuantConfig(backend=backend, **options)
    ann = annotate_graph(ir.Graph(model), profile, cfg)
    if acts is None:
        acts = {
            t.tensor: range_to_qparams(
                -4.0, 4.0, profile.activation_dtype, profile.activation_symmetric, "minmax"
            )
            for t in ann.of_kind("activation")
        }
    placed = materialize(model, ann, acts, profile, cfg.weights)
    return model, placed


def run(model: onnx.ModelProto, feed) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feed)


def test_int8_weight_storage_dequantizes_an_int8_initializer():
    float_model = graphs.conv_relu()
    w = onnx.numpy_helper.to_array(float_model.graph.initializer[0])
    model, placed = place(graphs.conv_relu())
    assert [(p.tensor, p.kind) for p in placed] == [("x", "activation"), ("conv.weight", "weight")]
    g = ir.Graph(model)
    dq = g.producer[g.node_by_name("conv").input[1]]
    assert dq.op_type == "DequantizeLinear"
    assert ir.node_attrs(dq)["axis"] == 0
    stored = g.const_value(dq.input[0])
    qp = weight_qparams(w, 0)
    np.testing.assert_array_equal(stored, quantize_weight(w, qp))
    np.testing.assert_array_equal(g.const_value(dq.input[1]), qp.scale)
    assert g.const_value(dq.input[2]).dtype == np.int8
    assert "conv.weight" not in g.initializers  # the float weight is gone


def test_qdq_weight_storage_keeps_the_float_weight_behind_q_and_dq():
    model, _ = place(graphs.conv_relu(), weight_storage="qdq")
    g = ir.Graph(model)
    dq = g.producer[g.node_by_name("conv").input[1]]
    q = g.producer[dq.input[0]]
    assert (q.op_type, dq.op_type) == ("QuantizeLinear", "DequantizeLinear")
    assert q.input[0] == "conv.weight" and g.const_value("conv.weight").dtype == np.float32
    assert ir.node_attrs(q)["axis"] == ir.node_attrs(dq)["axis"] == 0


def test_activation_gets_a_quantize_dequantize_pair_with_its_qparams():
    model, placed = place(graphs.conv_relu())
    g = ir.Graph(model)
    dq = g.producer[g.node_by_name("conv").input[0]]
    q = g.producer[dq.input[0]]
    assert q.input[0] == "x" and q.input[1] == dq.input[1] and q.input[2] == dq.input[2]
    assert g.const_value(q.input[1]) == pytest.approx(4.0 / 127)
    assert int(g.const_value(q.input[2])) == 0
    assert placed[0].qparams.method == "minmax"


def test_only_annotated_consumers_are_rewired():
    model, _ = place(graphs.shared_input())
    g = ir.Graph(model)
    assert g.node_by_name("sigmoid").input[0] == "x"
    assert g.node_by_name("conv").input[0] != "x"
    model, _ = place(graphs.shared_weight())
    g = ir.Graph(model)
    assert g.node_by_name("convt").input[1] == "shared.weight"  # declined: stays float
    assert g.producer[g.node_by_name("conv").input[1]].op_type == "DequantizeLinear"


def test_activation_without_qparams_stays_float():
    model, placed = place(graphs.conv_relu(), acts={})
    assert [p.tensor for p in placed] == ["conv.weight"]
    assert graphs.count_ops(model, "QuantizeLinear") == 0
    assert ir.Graph(model).node_by_name("conv").input[0] == "x"


def test_onnxruntime_bias_is_int32_with_input_times_weight_scale():
    model, placed = place(graphs.with_tail(graphs.conv_relu()), "onnxruntime")
    kinds = {p.tensor: p for p in placed}
    assert set(kinds) == {"x", "conv.weight", "conv.bias", "y"}
    bias = kinds["conv.bias"]
    assert bias.qparams.zero_point.dtype == np.int32 and bias.qparams.axis == 0
    np.testing.assert_allclose(
        bias.qparams.scale, kinds["x"].qparams.scale * kinds["conv.weight"].qparams.scale, rtol=1e-6
    )
    g = ir.Graph(model)
    dq = g.producer[g.node_by_name("conv").input[2]]
    assert g.const_value(dq.input[0]).dtype == np.int32
    float_bias = onnx.numpy_helper.to_array(graphs.conv_relu().graph.initializer[1])
    dequantized = g.const_value(dq.input[0]) * g.const_value(dq.input[1])
    assert np.max(np.abs(dequantized - float_bias)) <= np.max(bias.qparams.scale)


def test_materialized_model_is_close_to_the_float_model():
    float_model = graphs.conv_relu()
    model, _ = place(graphs.conv_relu())
    onnx.checker.check_model(model)
    for seed in range(3):
        feed = graphs.random_inputs(float_model, seed)
        (want,), (got,) = run(float_model, feed), run(model, feed)
        cos = float(want.ravel() @ got.ravel() / (np.linalg.norm(want) * np.linalg.norm(got)))
        assert cos > 0.999
        assert np.max(np.abs(want - got)) < 0.1


def test_opset_is_raised_to_13_for_per_axis_qdq_and_never_lowered():
    model = graphs.conv_relu()
    model.opset_import[0].version = 12
    model, _ = place(model)
    assert ir.opset_version(model) == 13
    model, _ = place(graphs.conv_relu())
    assert ir.opset_version(model) == graphs.OPSET


def test_derived_names_do_not_clash_with_existing_tensors():
    model, _ = place(graphs.name_clash())
    onnx.checker.check_model(model)
    names = [o for n in model.graph.node for o in n.output]
    assert len(names) == len(set(names))
    g = ir.Graph(model)
    assert g.node_by_name("conv").input[2] == "x_scale"  # the model's own tensor, untouched
    assert g.node_by_name("x_QuantizeLinear").op_type == "Relu"
    feed = graphs.random_inputs(model)
    assert run(model, feed)[0].shape == (1, 16, 8, 8)


def test_grouped_conv_transpose_int32_bias():
    # ConvTranspose(group=2): the weight's channel axis (1) holds out_channels / group scales,
    # while the bias has out_channels values; the int32 bias scale must cover every channel.
    # (onnxruntime's own profile keeps ConvTranspose float: its CPU provider has no integer
    # kernel for it; a profile with one, as an execution provider may have, quantizes it.)
    model = ir.infer_shapes(graphs.with_tail(graphs.conv_transpose(group=2)))
    profile = PROFILES["onnxruntime"].replace(
        integer_kernel_ops=PROFILES["onnxruntime"].integer_kernel_ops | {"ConvTranspose"}
    )
    cfg = QuantConfig(backend="onnxruntime")
    ann = annotate_graph(ir.Graph(model), profile, cfg)
    acts = {
        t.tensor: range_to_qparams(-8.0, 8.0, "uint8", False, "minmax")
        for t in ann.of_kind("activation")
    }
    feed = graphs.random_inputs(model)
    want = run(model, feed)[0]
    placed = materialize(model, ann, acts, profile, cfg.weights)
    assert check(model, profile) == []
    bias = next(p for p in placed if p.kind == "bias")
    assert bias.qparams.scale.shape == (16,)
    got = run(model, feed)[0]
    assert (
        float(np.dot(want.ravel(), got.ravel()) / (np.linalg.norm(want) * np.linalg.norm(got)))
        > 0.99
    )


# --------------------------------------------------------------------- 16-bit activations
def _sixteen_bit_run(model, **options):
    import onnxq

    return onnxq.quantize(model, graphs.random_batches(model, 8), backend="onnxruntime", **options)


def _pairs(model):
    return [
        (n.op_type, n.domain)
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    ]


def test_int16_writes_uint16_pairs_in_the_contrib_domain_below_opset_21():
    m = graphs.residual_add(32)
    int8 = _sixteen_bit_run(m)
    a16 = _sixteen_bit_run(m, precision="int16")
    acts = [p for p in a16.report.placed if p.kind == "activation"]
    assert acts and {p.dtype for p in acts} == {"uint16"} and {p.bits for p in acts} == {16}
    assert {p.dtype for p in a16.report.placed if p.kind == "weight"} == {"int8"}  # A16W8
    assert ("QuantizeLinear", "com.microsoft") in _pairs(a16.model)
    assert any(i.domain == "com.microsoft" for i in a16.model.opset_import)
    assert ir.opset_version(a16.model) == 17  # no opset conversion
    assert a16.report.violations == []
    assert a16.report.fidelity[0].cosine > int8.report.fidelity[0].cosine


def test_int16_at_opset_21_uses_the_default_domain():
    m = graphs.residual_add(32)
    m.opset_import[0].version = 21
    a16 = _sixteen_bit_run(m, precision="int16")
    assert _pairs(a16.model) and {d for _, d in _pairs(a16.model)} == {""}
    assert a16.report.violations == []


def test_an_override_mixes_8_and_16_bit_activations_in_one_model():
    m = graphs.residual_add(32)
    mixed = _sixteen_bit_run(m, overrides=[{"tensor": "skip", "precision": "int16"}])
    dtypes = {p.tensor: p.dtype for p in mixed.report.placed if p.kind == "activation"}
    assert dtypes["skip"] == "uint16" and dtypes["x"] == "uint8"
    records = read_metadata(mixed.model)
    assert records is not None
    assert (records["skip"]["dtype"], records["skip"]["bits"]) == ("uint16", 16)
    assert (records["x"]["dtype"], records["x"]["bits"]) == ("uint8", 8)
    assert mixed.report.violations == []


def test_bits_wider_than_a_weight_are_refused_before_calibration():
    from onnxq.errors import ConfigError

    with pytest.raises(ConfigError, match=r"bits=12 for tensor 'conv1\.weight'"):
        _sixteen_bit_run(
            graphs.residual_add(32), precision="int16", overrides=[{"node": "conv1", "bits": 12}]
        )


def test_a_bias_that_would_saturate_int32_under_16_bit_activations_stays_float():
    # PP-OCRv5 det at int16: input scale x weight scale ~1e-7, so a bias of a few hundred
    # passes 2**31 steps; clipped, the channel's output moved by the whole excess
    m = graphs.residual_add(32)
    bias = next(i for i in m.graph.initializer if i.name == "conv1.bias")
    value = onnx.numpy_helper.to_array(bias).copy()
    value[0] = 5000.0
    bias.CopyFrom(onnx.numpy_helper.from_array(value, "conv1.bias"))
    result = _sixteen_bit_run(m, precision="int16")
    ints = [
        onnx.numpy_helper.to_array(i)
        for i in result.model.graph.initializer
        if i.data_type == onnx.TensorProto.INT32 and i.dims
    ]
    assert ints and all(np.abs(v.astype(np.int64)).max() < 2**31 - 1 for v in ints)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    batch = graphs.random_batches(m, 1, seed=5)[0]
    got = ort.InferenceSession(result.model.SerializeToString(), so).run(["y"], batch)[0]
    want = ort.InferenceSession(m.SerializeToString(), so).run(["y"], batch)[0]
    assert np.abs(got - want)[:, 0].max() < 0.01 * 5000  # channel 0 keeps its bias
