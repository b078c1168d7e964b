"""Dynamic kernels written from the dynamic rules, checked against onnxruntime: the float model
and onnxruntime's own ``quantize_dynamic`` on the same graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq.materialize.qdq import read_metadata
from tests import control_flow_graphs as cf
from tests import graphs
from tests.cpus import skip_unless_fused_numerics_here


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnxq.quantize(model, backend="onnxruntime", dynamic=True).model


def ort_dynamic(model: onnx.ModelProto, tmp_path, **options) -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    src, dst = tmp_path / "float.onnx", tmp_path / "ort.onnx"
    onnx.save(model, src)
    quantize_dynamic(src, dst, **options)
    return onnx.load(dst)


def test_matmuls_become_dynamic_kernels_closer_to_float_than_onnxruntimes(tmp_path):
    m = graphs.matmul_stack()
    w1 = next(t for t in m.graph.initializer if t.name == "w1")
    loud = onnx.numpy_helper.to_array(w1).copy()
    loud[:, :8] *= 30  # a few loud output columns: one per-tensor scale rounds the rest away
    w1.CopyFrom(onnx.numpy_helper.from_array(loud, "w1"))
    x = np.random.default_rng(3).normal(0, 1, (4, 8, 128)).astype(np.float32)
    ours = dynamic(m)
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 2 and "MatMul" in ops  # the scores stay float
    ref, mine = run(m, {"x": x}), run(ours, {"x": x})
    theirs = run(ort_dynamic(m, tmp_path), {"x": x})  # its default: per-tensor weights
    assert cosine(mine[0], ref[0]) > 0.999
    assert 1 - cosine(mine[0], ref[0]) < 0.5 * (1 - cosine(theirs[0], ref[0]))
    np.testing.assert_array_equal(mine[1], ref[1])


@pytest.mark.parametrize("trans_b", [True, False])
def test_a_gemm_folds_alpha_beta_and_its_bias(trans_b):
    m = graphs.gemm(trans_b=trans_b, k=128, n=64)
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    gemm.attribute.extend(
        [onnx.helper.make_attribute("alpha", 0.5), onnx.helper.make_attribute("beta", 2.0)]
    )
    x = np.random.default_rng(0).normal(0, 1, (2, 128)).astype(np.float32)
    ours = dynamic(m)
    assert [n.op_type for n in ours.graph.node] == ["DynamicQuantizeMatMul", "Relu"]
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_a_matmuls_bias_add_goes_into_the_kernel():
    r = graphs.rng(0)
    m = graphs.model(
        [
            onnx.helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
            onnx.helper.make_node("Add", ["mm", "b"], ["y"], name="bias"),
            onnx.helper.make_node("Relu", ["y"], ["out"], name="relu"),
        ],
        [graphs.tensor("x", [2, 8, 128])],
        [graphs.tensor("out", [2, 8, 96])],
        [graphs.init("w", graphs.weight(r, 128, 96)), graphs.init("b", graphs.weight(r, 96))],
    )
    result = onnxq.quantize(m, backend="onnxruntime", dynamic=True)
    ours = result.model
    assert [n.op_type for n in ours.graph.node] == ["DynamicQuantizeMatMul", "Relu"]
    assert len(ours.graph.node[0].input) == 5  # A, B, scale, zero point, bias
    assert {d.node: d.rule for d in result.report.decisions}["bias"] == "fused"
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 128)).astype(np.float32)
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_an_input_several_matmuls_read_is_quantized_once():
    from onnxq.backends.check import check
    from onnxq.backends.profile import ONNXRUNTIME

    r = graphs.rng(1)
    nodes = [
        onnx.helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)
    ]
    inits = [graphs.init(f"w{i}", graphs.weight(r, 128, 64)) for i in range(3)]
    outs = [graphs.tensor(f"y{i}", [2, 8, 64]) for i in range(3)]
    m = graphs.model(nodes, [graphs.tensor("x", [2, 8, 128])], outs, inits)
    ours = dynamic(m)
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeLinear") == 1 and ops.count("MatMulIntegerToFloat") == 3
    assert check(ours, ONNXRUNTIME) == []
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 128)).astype(np.float32)
    for mine, ref in zip(run(ours, {"x": x}), run(m, {"x": x}), strict=True):
        assert cosine(mine, ref) > 0.999


def test_an_lstm_becomes_dynamic_quantize_lstm_close_to_float():
    m = graphs.recurrent("LSTM", features=64, hidden=64)
    x = np.random.default_rng(1).normal(0, 1, (20, 2, 64)).astype(np.float32)
    ours = dynamic(m)
    assert ours.graph.node[0].op_type == "DynamicQuantizeLSTM"
    w = next(t for t in ours.graph.initializer if t.name.startswith("rnn.W_quantized"))
    assert list(w.dims) == [1, 64, 256] and w.data_type == onnx.TensorProto.INT8  # transposed
    assert cosine(run(ours, {"x": x})[0], run(m, {"x": x})[0]) > 0.999


def test_a_gru_stays_float_and_its_matmul_does_not():
    m = graphs.recurrent("GRU")
    ours = dynamic(m)
    assert [n.op_type for n in ours.graph.node][:1] == ["GRU"]
    assert "DynamicQuantizeMatMul" in [n.op_type for n in ours.graph.node]


@pytest.mark.parametrize(("cpu", "bits"), [("x86-vnni", 8), ("x86-avx2", 7)])
def test_metadata_marks_activations_quantized_at_run_time(cpu, bits):
    # the dynamic kernels add u8 x s8 products in int16 pairs on AVX2 too: 7-bit weights there
    m = graphs.matmul_stack()
    result = onnxq.quantize(
        m, backend="onnxruntime", dynamic=True, target_cpu=cpu, dynamic_weight_scales="channel"
    )
    records = read_metadata(result.model)
    assert records is not None
    assert records["x"]["runtime"] is True and records["x"]["dtype"] == "uint8"
    assert records["x"]["symmetric"] is False
    w1 = records["w1"]
    assert (w1["dtype"], w1["bits"], w1["axis"]) == ("int8", bits, 1)
    stored = next(t for t in result.model.graph.initializer if t.name.startswith("w1_quantized"))
    assert np.abs(onnx.numpy_helper.to_array(stored)).max() == 2 ** (bits - 1) - 1


def test_the_same_input_gives_the_same_bytes():
    m = graphs.recurrent("LSTM")
    assert dynamic(m).SerializeToString() == dynamic(m).SerializeToString()


def branch_projections(seed: int = 0) -> onnx.ModelProto:
    """``If(c, then: x Wq + x Wk, else: x Wv)`` over an outer-scope ``x`` [2, 8, 128]: the then
    branch reads ``x`` twice (one DynamicQuantizeLinear for both), the else branch once."""
    from onnx import helper

    r = graphs.rng(seed)
    then_graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "wq"], ["q"], name="then_q"),
            helper.make_node("MatMul", ["x", "wk"], ["k"], name="then_k"),
            helper.make_node("Add", ["q", "k"], ["then_y"], name="then_add"),
        ],
        "then",
        [],
        [graphs.tensor("then_y", [2, 8, 64])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wv"], ["else_y"], name="else_v")],
        "else",
        [],
        [graphs.tensor("else_y", [2, 8, 64])],
    )
    node = helper.make_node(
        "If", ["c"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph
    )
    inputs = [graphs.tensor("x", [2, 8, 128]), graphs.tensor("c", [], onnx.TensorProto.BOOL)]
    inits = [graphs.init(n, graphs.weight(r, 128, 64)) for n in ("wq", "wk", "wv")]
    return graphs.model([node], inputs, [graphs.tensor("y", [2, 8, 64])], inits)


def body_ops(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Each body's op types, by the name of its graph."""
    bodies = onnxq.ir.all_bodies(model.graph)
    return {b.graph.name: [n.op_type for n in b.graph.node] for b in bodies}


@pytest.mark.parametrize(
    ("build", "fixed", "kernels"),
    [
        (lambda: cf.loop_matmul(128), {"steps": 5}, {"loop_body": 1}),
        (lambda: cf.scan_matmul(128, steps=2), {}, {"scan_body": 1}),
        (lambda: cf.if_in_scan(64), {}, {"then": 2}),
        (lambda: cf.if_in_loop(64), {"steps": 5}, {"odd": 1}),
    ],
)
def test_matmuls_inside_control_flow_bodies_get_dynamic_kernels_there(build, fixed, kernels):
    from onnxq.backends.check import check
    from onnxq.backends.profile import ONNXRUNTIME

    m = build()
    batches = cf.batches(m, 3, **fixed)
    result = onnxq.quantize(m, batches, backend="onnxruntime", dynamic=True)
    found = body_ops(result.model)
    for body, count in kernels.items():
        assert found[body].count("DynamicQuantizeMatMul") == count and "MatMul" not in found[body]
    assert check(result.model, ONNXRUNTIME) == []
    for batch in batches:
        for mine, ref in zip(run(result.model, batch), run(m, batch), strict=True):
            assert cosine(mine, ref) > 0.995  # one 7-bit weight scale (x86-avx2): 0.997


def test_a_branch_that_reads_an_outer_input_twice_quantizes_it_once_there():
    m = branch_projections()
    result = dynamic(m)
    found = body_ops(result)
    assert found["then"].count("DynamicQuantizeLinear") == 1
    assert found["then"].count("MatMulIntegerToFloat") == 2
    assert found["else"] == ["DynamicQuantizeMatMul"]
    x = np.random.default_rng(0).normal(0, 1, (2, 8, 128)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        assert cosine(run(result, feed)[0], run(m, feed)[0]) > 0.999


def test_an_lstm_inside_an_if_branch_becomes_dynamic_quantize_lstm():
    from onnx import helper

    cell = graphs.recurrent("LSTM", features=64, hidden=64)
    branch = helper.make_graph(list(cell.graph.node), "lstm_branch", [], list(cell.graph.output))
    other = helper.make_graph(
        [helper.make_node("Identity", ["float_out"], ["out_else"], name="pass")],
        "float_branch",
        [],
        [graphs.tensor("out_else", ["t", 2, 128])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "skip.w"], ["float_out"], name="skip"),
        helper.make_node(
            "If", ["c"], ["out"], name="choose", then_branch=branch, else_branch=other
        ),
    ]
    r = graphs.rng(2)
    inits = [*cell.graph.initializer, graphs.init("skip.w", graphs.weight(r, 64, 128))]
    inputs = [*cell.graph.input, graphs.tensor("c", [], onnx.TensorProto.BOOL)]
    m = graphs.model(nodes, inputs, [graphs.tensor("out", ["t", 2, 128])], inits)
    result = dynamic(m)
    assert body_ops(result)["lstm_branch"][0] == "DynamicQuantizeLSTM"
    x = np.random.default_rng(1).normal(0, 1, (20, 2, 64)).astype(np.float32)
    feed = {"x": x, "c": np.array(True)}
    assert cosine(run(result, feed)[0], run(m, feed)[0]) > 0.999


def test_a_gated_products_outlier_channels_run_in_float_beside_the_kernel(tmp_path, monkeypatch):
    import onnxq.materialize.dynamic as md
    from onnxq.place.rules.gated import OutlierSplit

    m = graphs.swiglu(outliers=(3, 17, 200))
    x = np.random.default_rng(4).normal(0, 1, (2, 8, 128)).astype(np.float32)
    ours = dynamic(m)
    ops = graphs.op_types(ours)
    assert ops.count("Gather") == 1 and ops.count("MatMul") == 1  # the 3 channels' float rows
    assert ops.count("Mul") == 2  # SiLU's and the product: the up weights shrink the outliers
    monkeypatch.setattr(md, "GATED_OUTLIERS", OutlierSplit(ratio=1e9, most=16))
    whole = dynamic(m)  # no channel is an outlier: the product quantized whole
    assert "Gather" not in graphs.op_types(whole)
    ref, mine, unsplit = run(m, {"x": x})[0], run(ours, {"x": x})[0], run(whole, {"x": x})[0]
    theirs = run(ort_dynamic(m, tmp_path), {"x": x})[0]
    assert cosine(mine, ref) > 0.999
    assert 1 - cosine(mine, ref) < 0.25 * (1 - cosine(unsplit, ref))
    assert 1 - cosine(mine, ref) < 0.25 * (1 - cosine(theirs, ref))


def test_a_gated_product_whose_up_output_is_read_elsewhere_masks_its_outliers():
    m = graphs.swiglu(outliers=(3, 17, 200), up_read_twice=True)
    x = np.random.default_rng(4).normal(0, 1, (2, 8, 128)).astype(np.float32)
    ours = dynamic(m)
    assert graphs.op_types(ours).count("Mul") == 3  # SiLU's, the product and the mask
    (ref_y, ref_u), (y, u) = run(m, {"x": x}), run(ours, {"x": x})
    assert cosine(y, ref_y) > 0.999 and cosine(u, ref_u) > 0.999  # u keeps its scale
    np.testing.assert_allclose(np.abs(u).max(), np.abs(ref_u).max(), rtol=0.05)


def test_a_gated_block_gives_the_same_bytes_twice():
    m = graphs.swiglu(outliers=(3, 17), gain=True)
    assert dynamic(m).SerializeToString() == dynamic(m).SerializeToString()


def optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The op types of ``model`` after onnxruntime's default session optimizations."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]


@pytest.mark.parametrize("cpu", ["x86-vnni", "x86-avx2"])
def test_a_residual_add_before_a_layernorm_is_a_sum_onnxruntime_keeps_apart(cpu, tmp_path):
    # the bias goes into the kernel, which leaves Add -> LayerNormalization to onnxruntime's
    # SkipLayerNormalization fusion (a slower CPU kernel) unless the Add is written as a Sum
    m = graphs.encoder_block(hidden=128, skip_shape=("b", "s", 128))
    ours = onnxq.quantize(m, backend="onnxruntime", dynamic=True, target_cpu=cpu).model
    ops = [n.op_type for n in ours.graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 1 and ops.count("Sum") == 1
    assert "Add" not in ops  # the bias went into the kernel, the residual Add became the Sum
    fused = optimized_ops(ours, tmp_path)
    assert "SkipLayerNormalization" not in fused and "LayerNormalization" in fused
    assert "SkipLayerNormalization" in optimized_ops(m, tmp_path)  # the float model's
    skip_unless_fused_numerics_here(cpu)
    r = np.random.default_rng(1)
    feed = {k: r.normal(0, 1, (2, 6, 128)).astype(np.float32) for k in ("x", "skip")}
    assert cosine(run(ours, feed)[0], run(m, feed)[0]) > 0.999


def test_the_kernels_weight_zero_point_is_left_out():
    # symmetric int8 weights: zero, the kernels' default (a per-column tensor of zeros only
    # sends onnxruntime's GEMM down its per-column zero-point path)
    ours = dynamic(graphs.matmul_stack())
    kernels = [n for n in ours.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert kernels and all(len(n.input) == 3 for n in kernels)
    assert not [t.name for t in ours.graph.initializer if "zero_point" in t.name]


def kernel_scales(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Each dynamic kernel's weight-scale shape, by the kernel's output."""
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    at = {"DynamicQuantizeMatMul": 2, "MatMulIntegerToFloat": 3}
    return {n.output[0]: inits[n.input[at[n.op_type]]] for n in model.graph.node if n.op_type in at}


@pytest.mark.parametrize("cpu", ["x86-vnni", "x86-avx2"])
def test_auto_writes_one_scale_where_it_keeps_the_weight_and_columns_where_not(cpu):
    m = graphs.matmul_stack()
    w1 = next(t for t in m.graph.initializer if t.name == "w1")
    loud = onnx.numpy_helper.to_array(w1).copy()
    loud[:, :8] *= 30
    w1.CopyFrom(onnx.numpy_helper.from_array(loud, "w1"))
    x = np.random.default_rng(3).normal(0, 1, (4, 8, 128)).astype(np.float32)
    out = {}
    for mode in ("auto", "channel", "tensor"):
        out[mode] = onnxq.quantize(
            m, backend="onnxruntime", dynamic=True, target_cpu=cpu, dynamic_weight_scales=mode
        ).model
    assert kernel_scales(out["auto"]) == {"h": (256,), "y": ()}
    assert kernel_scales(out["channel"]) == {"h": (256,), "y": (128,)}
    assert kernel_scales(out["tensor"]) == {"h": (), "y": ()}
    records = read_metadata(out["auto"])
    assert records is not None and (records["w1"]["axis"], records["w2"]["axis"]) == (1, None)
    skip_unless_fused_numerics_here(cpu)
    ref = run(m, {"x": x})[0]
    err = {mode: 1 - cosine(run(model, {"x": x})[0], ref) for mode, model in out.items()}
    assert err["auto"] < 2 * err["channel"] and err["auto"] < 0.25 * err["tensor"]


def test_an_up_projection_given_one_scale_leaves_its_columns_alone_and_masks_the_outliers():
    from onnxq.config.overrides import Override

    m = graphs.swiglu(outliers=(3, 17, 200))
    x = np.random.default_rng(4).normal(0, 1, (2, 8, 128)).astype(np.float32)
    forced = onnxq.quantize(
        m,
        backend="onnxruntime",
        dynamic=True,
        config={"overrides": [Override(node="up", per_channel=False)]},
    ).model
    assert kernel_scales(forced)["u"] == ()
    # divided by 1024 under one scale the outlier columns would round to zero: a mask instead
    assert graphs.op_types(forced).count("Mul") == 3
    assert cosine(run(forced, {"x": x})[0], run(m, {"x": x})[0]) > 0.995  # 7-bit (avx2): 0.997
