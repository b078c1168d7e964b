"""Model I/O (safe loading, atomic saving) and the Graph index."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import ir
from onnxq.errors import InternalError, ModelLoadError, OutputError, UnsupportedModelError
from tests import graphs


def with_external_weight(
    folder: Path, location: str, write_to: Path | None = None, length_pad: int = 0
) -> Path:
    """Save conv_relu with its weight in external data at ``location`` (the bytes go to
    ``write_to``, default ``folder / location``); returns the model path."""
    model = graphs.conv_relu()
    weight = model.graph.initializer[0]
    raw = numpy_helper.to_array(weight).tobytes()
    target = write_to or folder / location
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(raw)
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    weight.external_data.add(key="offset", value="0")
    weight.external_data.add(key="length", value=str(len(raw) + length_pad))
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


# ------------------------------------------------------------------------------- loading
def test_load_model_checks_names_and_infers_shapes(model_file):
    model = graphs.conv_relu()
    for node in model.graph.node:
        node.name = ""
    loaded = ir.load_model(model_file(model))
    assert [n.name for n in loaded.graph.node] == ["Conv_0", "Relu_1"]
    g = ir.Graph(loaded)
    assert g.shape("conv_out") == (1, 16, 8, 8)
    assert g.elem_type("conv_out") == TensorProto.FLOAT


def test_load_model_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="model file not found"):
        ir.load_model(tmp_path / "nope.onnx")


def test_load_model_non_onnx_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_bytes(b"\x00\x01\x02 this is not a protobuf " * 4)
    with pytest.raises(ModelLoadError, match="not a readable ONNX file"):
        ir.load_model(path)
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="holds no graph"):
        ir.load_model(path)


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.95])
def test_load_model_truncated_file(tmp_path, fraction):
    data = graphs.conv_relu().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelLoadError, match=r"truncated\.onnx"):
        ir.load_model(path)


def test_load_model_invalid_graph(model_file):
    model = graphs.conv_relu()
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(ModelLoadError, match="invalid ONNX graph"):
        ir.load_model(model_file(model))


@pytest.mark.parametrize(
    ("op", "opset", "hint"),
    [
        ("LayerNormalization", 13, "or export it at opset 17 or later"),
        ("SimplifiedLayerNormalization", 17, "ONNX does not define SimplifiedLayerNormalization"),
    ],
)
def test_an_onnxruntime_optimized_model_is_refused_with_what_to_do(tmp_path, op, opset, hint):
    from onnx import helper

    nodes = [helper.make_node(op, ["x", "g"], ["y"], name="ln", axis=-1)]
    graph = helper.make_graph(
        nodes,
        "g",
        [graphs.tensor("x", [2, 8])],
        [graphs.tensor("y", [2, 8])],
        [graphs.init("g", np.ones(8, np.float32))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8
    )  # as onnxruntime's optimizer writes it: unchecked
    path = tmp_path / "optimized.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="before that optimization") as err:
        ir.load_model(path)
    assert "invalid ONNX graph" in str(err.value) and hint in str(err.value)


def test_external_data_inside_the_folder_loads(tmp_path):
    path = with_external_weight(tmp_path, "weights.bin")
    loaded = ir.load_model(path)
    want = numpy_helper.to_array(graphs.conv_relu().graph.initializer[0])
    np.testing.assert_array_equal(ir.Graph(loaded).const_value("conv.weight"), want)


def test_external_data_leaving_the_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external_weight(folder, "../x", write_to=tmp_path / "x")
    with pytest.raises(ModelLoadError, match="refused") as info:
        ir.load_model(path)
    assert "leaves the model's folder" in str(info.value)


def test_external_data_absolute_path_is_refused(tmp_path):
    outside = tmp_path / "elsewhere" / "w.bin"
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external_weight(folder, str(outside), write_to=outside)
    with pytest.raises(ModelLoadError, match="refused") as info:
        ir.load_model(path)
    assert "absolute path" in str(info.value)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    outside = tmp_path / "secret.bin"
    path = with_external_weight(folder, "link.bin", write_to=outside)
    os.symlink(outside, folder / "link.bin")
    with pytest.raises(ModelLoadError, match="refused"):
        ir.load_model(path)


def test_external_data_missing_or_short_file(tmp_path):
    path = with_external_weight(tmp_path, "weights.bin", length_pad=8)
    with pytest.raises(ModelLoadError, match=r"past the end of 'weights\.bin'"):
        ir.load_model(path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelLoadError, match="not found next to the model"):
        ir.load_model(path)


def test_old_opset_is_upgraded_to_13(model_file):
    model = graphs.conv_relu()
    model.opset_import[0].version = 11
    model.ir_version = 6
    loaded = ir.load_model(model_file(model))
    assert ir.opset_version(loaded) == 13
    np.testing.assert_array_equal(
        ir.Graph(loaded).const_value("conv.weight"),
        numpy_helper.to_array(graphs.conv_relu().graph.initializer[0]),
    )


@pytest.mark.parametrize("as_input", [False, True])
def test_an_opset_6_prelu_keeps_one_slope_per_channel(as_input):
    # before opset 7 a 1-D slope of C values is per channel; onnx's converter leaves it 1-D,
    # which from opset 7 on broadcasts against the last axis: here also 3 wide, so nothing
    # fails and every value would silently take the wrong slope
    slope = np.array([0.1, 0.5, 0.9], np.float32)
    inputs = [graphs.tensor("x", [2, 3, 4, 3])]
    if as_input:  # IR 3 lists every initializer among the inputs
        inputs.append(graphs.tensor("slope", [3]))
    model = graphs.model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu")],
        inputs,
        [graphs.tensor("y", [2, 3, 4, 3])],
        [numpy_helper.from_array(slope, "slope")],
        opset=6,
    )
    loaded = ir.upgrade_opset(model, 13)
    onnx.checker.check_model(loaded)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 3)).astype(np.float32)
    session = ort.InferenceSession(loaded.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, np.where(x >= 0, x, x * slope.reshape(1, 3, 1, 1)))


def test_nodes_out_of_topological_order_are_sorted_on_load(model_file):
    # some exporters (an fp16 converter of a background-removal model) write nodes out of
    # order; onnxruntime runs them, onnx's checker refuses them
    model = graphs.conv_relu()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    path = model_file(model)
    record = ir.LoadRecord()
    loaded = ir.load_model(path, record=record)
    assert [n.name for n in loaded.graph.node] == [n.name for n in nodes]
    assert record == ir.LoadRecord(sorted_nodes=True)
    record = ir.LoadRecord()
    ir.load_model(model_file(graphs.conv_relu(), "sorted.onnx"), record=record)
    assert record == ir.LoadRecord()


def test_upgrade_failure_is_an_unsupported_model_error():
    model = graphs.conv_relu()
    model.opset_import[0].version = 1  # Conv/Relu of opset 1 with opset-17 attributes
    model.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="re-export the model with opset >= 13"):
        ir.upgrade_opset(model, 13)


# ------------------------------------------------------------------------------- saving
def test_save_model_is_atomic_and_equals_onnx_load(tmp_path):
    model = ir.infer_shapes(graphs.residual_add())
    out = tmp_path / "out.onnx"
    assert ir.save_model(model, out) == [out]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
    assert onnx.load(str(out)) == model
    assert out.read_bytes() == ir.serialize(model)
    ir.save_model(model, out)  # overwriting leaves no temporary file either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_save_model_with_external_data_round_trips(tmp_path):
    model = graphs.residual_add()
    before = ir.serialize(model)
    out = tmp_path / "big.onnx"
    written = ir.save_model(model, out, external_data=True)
    assert written == [out, tmp_path / "big.onnx.data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    assert ir.serialize(model) == before  # the in-memory model keeps its weights
    loaded = ir.load_model(out)
    for name in ("conv1.weight", "conv2.weight"):
        np.testing.assert_array_equal(
            ir.Graph(loaded).const_value(name), ir.Graph(model).const_value(name)
        )


def test_save_model_output_errors(tmp_path):
    model = graphs.conv_relu()
    with pytest.raises(OutputError, match="output folder does not exist"):
        ir.save_model(model, tmp_path / "missing" / "out.onnx")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError):
        ir.atomic_write_bytes(tmp_path / "file" / "out.onnx", b"data")


def test_serialize_is_deterministic():
    assert ir.serialize(graphs.residual_add()) == ir.serialize(graphs.residual_add())


# ------------------------------------------------------------------------------- the index
def test_graph_index_producers_consumers_and_constants():
    g = ir.Graph(ir.infer_shapes(graphs.residual_add()))
    assert g.producer["skip"].name == "relu1"
    assert [(n.name, i) for n, i in g.consumers["skip"]] == [("conv2", 0), ("add", 1)]
    assert g.graph_inputs == ["x"] and g.graph_outputs == ["y"]
    assert g.is_const("conv1.weight") and not g.is_const("x") and not g.is_const("skip")
    assert g.const_value("x") is None
    assert g.const_value("conv1.weight").shape == (16, 16, 3, 3)
    assert g.shape("conv1.weight") == (16, 16, 3, 3)
    assert g.value_info("skip").type.tensor_type.elem_type == TensorProto.FLOAT


def test_constant_nodes_are_constants():
    g = ir.Graph(graphs.with_constant_nodes())
    assert g.is_const("conv.weight") and set(g.constant_nodes) == {"conv.weight", "conv.bias"}
    assert g.const_value("conv.bias").shape == (16,)
    assert g.elem_type("conv.weight") == TensorProto.FLOAT
    node = helper.make_node("Constant", [], ["c"], value_ints=[1, 2])
    assert ir.constant_node_value(node).tolist() == [1, 2]


def test_symbolic_shapes():
    g = ir.Graph(ir.infer_shapes(graphs.shape_subgraph()))
    assert g.shape("x") == ("N", 16, 64)
    assert g.shape("nowhere") is None


def test_shape_inference_continues_past_shape_preserving_onnx_ml_ops():
    # onnx infers nothing after an ai.onnx.ml Scaler: a scikit-learn pipeline lost every shape
    g = ir.Graph(ir.infer_shapes(graphs.tabular()))
    assert g.shape("scaled")[1:] == (64,) and g.shape("projected")[1:] == (32,)
    assert g.shape("y")[1:] == (4,)


def test_unique_name_avoids_every_existing_name():
    g = ir.Graph(graphs.conv_relu())
    assert g.unique_name("x") == "x_1"
    assert g.unique_name("x") == "x_2"
    assert g.unique_name("conv") == "conv_1"
    assert g.unique_name("fresh") == "fresh"


def test_commit_sorts_topologically_and_drops_dead_nodes():
    model = graphs.residual_add()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    g = ir.Graph(model)
    g.add_node("Neg", ["skip"], ["unused"], "dead")
    g.add_initializer("orphan", np.zeros(3, np.float32))
    g.commit()
    assert [n.name for n in model.graph.node] == ["conv1", "relu1", "conv2", "add"]
    assert "orphan" not in g.initializers and "unused" not in g.producer
    onnx.checker.check_model(model)


def test_commit_rejects_a_cycle_as_onnxqs_own_bug(model_file):
    # loading refuses a model with a cycle (the checker); one after commit() is an edit's
    model = graphs.conv_relu()
    model.graph.node[0].input[0] = "y"  # conv reads relu's output
    with pytest.raises(ModelLoadError):
        ir.load_model(model_file(model))
    with pytest.raises(InternalError, match="after onnxq's edits the graph has a cycle"):
        ir.Graph(model).commit()


def test_edits_through_the_index_survive_node_removal():
    g = ir.Graph(ir.infer_shapes(graphs.identity_dropout()))
    g.remove_nodes([])
    g.remove_nodes([g.node_by_name("identity_in")])
    g.replace_uses("x_id", "x")
    conv = g.producer["conv_out"]
    conv.input[1] = "renamed.weight"  # an edit through the index must reach the graph
    assert g.node_by_name("conv").input[1] == "renamed.weight"
    assert "Identity" not in [n.op_type for n in g.nodes if n.name == "identity_in"]


def test_subgraph_reads_are_known():
    g = ir.Graph(graphs.if_model())
    assert g.subgraph_reads == {"t"}
    assert ir.has_subgraph(g.node_by_name("if"))
    assert not ir.has_subgraph(g.node_by_name("conv"))


def test_name_nodes_makes_unique_deterministic_names():
    model = graphs.residual_add()
    model.graph.node[0].name = ""
    model.graph.node[2].name = "add"  # duplicate of the last node's name
    ir.name_nodes(model.graph)
    names = [n.name for n in model.graph.node]
    assert names == ["Conv_0", "relu1", "add", "add_1"]


def test_set_opset_never_lowers():
    model = graphs.conv_relu()
    ir.set_opset(model, 13)
    assert ir.opset_version(model) == graphs.OPSET
    ir.set_opset(model, 19)
    assert ir.opset_version(model) == 19


def test_in_memory_model_is_never_modified():
    model = graphs.conv_bn_relu()
    before = ir.serialize(model)
    onnxq.quantize(model, graphs.random_batches(model, 2), progress=False)
    assert ir.serialize(model) == before


def test_drop_initializer_inputs_makes_weights_plain_and_raises_an_old_ir_version():
    model = graphs.conv_relu()
    graph = model.graph
    graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer
    )
    model.ir_version = 3
    assert ir.drop_initializer_inputs(model) == ["conv.weight", "conv.bias"]
    assert [i.name for i in graph.input] == ["x"]
    assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import))
    onnx.checker.check_model(model, full_check=True)
    assert ir.drop_initializer_inputs(model) == []  # nothing left to drop; IR stays


def test_drop_initializer_inputs_keeps_a_recent_ir_version():
    model = graphs.conv_relu()
    model.ir_version = 10
    assert ir.drop_initializer_inputs(model) == [] and model.ir_version == 10


def test_channel_peaks_are_one_output_for_the_block_and_the_model_stays_as_it_was():
    model = ir.infer_shapes(graphs.conv_relu())
    before = model.SerializeToString(deterministic=True)
    with ir.with_channel_peaks(
        model, [ir.Graph(model).value_info("conv_out")], ["y", "conv_out"]
    ) as aug:
        names = [o.name for o in aug.graph.output]
        assert names == ["conv_out", ir.PEAKS_OUTPUT]
        import onnxruntime as ort

        session = ort.InferenceSession(aug.SerializeToString(), providers=["CPUExecutionProvider"])
        conv, joined = session.run(names, graphs.random_inputs(model))
    assert joined.shape == (1, 32, 1, 1)
    np.testing.assert_array_equal(joined[:, :16, 0, 0], np.maximum(conv, 0).max(axis=(2, 3)))
    np.testing.assert_array_equal(joined[:, 16:, 0, 0], conv.max(axis=(2, 3)))
    assert model.SerializeToString(deterministic=True) == before


# ------------------------------------------------------------------------ IR version fitting
def test_lower_ir_version_only_when_the_model_uses_nothing_newer():
    model = graphs.conv_relu()
    model.ir_version = 14
    assert not ir.lower_ir_version(model, 14) and model.ir_version == 14  # not lower
    assert ir.lower_ir_version(model, 10) and model.ir_version == 10
    # a float8 weight (IR 9) or a cast to int4 (IR 10) keeps the model's own version
    for extra in (
        numpy_helper.from_array(np.zeros(2, np.float32), "f8"),
        helper.make_node("Cast", ["x"], ["x4"], to=TensorProto.INT4, name="c"),
        helper.make_node("RandomNormalLike", ["x"], ["r"], name="r", dtype=TensorProto.FLOAT8E5M2),
    ):
        newer = graphs.conv_relu()
        newer.ir_version = 14
        if isinstance(extra, onnx.TensorProto):
            extra.data_type = TensorProto.FLOAT8E4M3FN
            extra.raw_data = b"\x00\x00"
            newer.graph.initializer.append(extra)
        else:
            newer.graph.node.append(extra)
        assert not ir.lower_ir_version(newer, 8) and newer.ir_version == 14
    # local functions: their overloads came with IR 10
    with_function = graphs.conv_relu()
    with_function.ir_version = 14
    with_function.functions.append(
        helper.make_function(
            "local",
            "f",
            ["a"],
            ["b"],
            [helper.make_node("Identity", ["a"], ["b"])],
            [helper.make_opsetid("", 13)],
        )
    )
    assert not ir.lower_ir_version(with_function, 9)
    assert ir.lower_ir_version(with_function, 10)


def test_sessions_load_a_model_newer_than_onnxruntime_reads_without_changing_it():
    newest = ir.runtime_ir_version()
    assert 4 <= newest <= onnx.IR_VERSION
    model = graphs.conv_relu()
    model.ir_version = onnx.IR_VERSION
    payload = ir.session_bytes_or_path(model, Path("/nonexistent"))  # small: bytes
    assert onnx.load_from_string(payload).ir_version == newest
    assert model.ir_version == onnx.IR_VERSION
    import onnxruntime as ort

    ort.InferenceSession(payload, providers=["CPUExecutionProvider"])  # loads
    # a model that needs its newer version goes as it is (onnxruntime then refuses it itself)
    newer = graphs.conv_relu()
    newer.ir_version = onnx.IR_VERSION
    newer.graph.node.append(helper.make_node("Cast", ["y"], ["y4"], to=TensorProto.INT4))
    assert (
        onnx.load_from_string(ir.session_bytes_or_path(newer, Path("/nonexistent"))).ir_version
        == onnx.IR_VERSION
    )


def _dynamic_width(model: onnx.ModelProto) -> onnx.ModelProto:
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.dim[3].dim_param = "W"
    return ir.infer_shapes(model)


def test_same_shape_sees_through_fresh_symbols_of_a_dynamic_width():
    from tests import graphs

    g = ir.Graph(_dynamic_width(graphs.residual_add()))
    a, b = g.shape("conv2_out"), g.shape("skip")
    assert a != b and a[:3] == b[:3] == (1, 16, 8)  # shape inference names each width afresh
    assert g.same_shape("conv2_out", "skip") is True
    assert g.same_shape("x", "x") is True


def test_same_shape_is_false_for_a_broadcast_and_none_when_unknown():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[3], keepdims=1),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Add", ["r", "m"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8
    g = ir.Graph(ir.infer_shapes(model))
    assert g.same_shape("r", "m") is False  # [1, 4, H, W] against [1, 4, H, 1]
    assert g.same_shape("r", "nowhere") is None


def _shared_bias_gemms(identity: bool = False) -> onnx.ModelProto:
    """x[4, 256] -> Gemm(w1, b) -> Relu -> Gemm(w2, b) -> y: one bias initializer, two
    layers (the torch exporter merges equal initializers); ``identity``: each Gemm reads it
    through an Identity of its own (the legacy exporter's form).  Large enough (65536
    multiply-adds per sample) that the onnxruntime profile quantizes both."""
    from onnx import helper

    r = graphs.rng(6)
    b1, b2 = ("b1", "b2") if identity else ("b", "b")
    nodes = [
        helper.make_node("Identity", ["b"], [b], name=f"copy_{b}") for b in (b1, b2) if identity
    ]
    nodes += [
        helper.make_node("Gemm", ["x", "w1", b1], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", b2], ["y"], name="fc2"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", [4, 256])],
        [graphs.tensor("y", [4, 256])],
        [
            graphs.init("w1", graphs.weight(r, 256, 256, scale=0.02)),
            graphs.init("w2", graphs.weight(r, 256, 256, scale=0.12)),
            graphs.init("b", graphs.weight(r, 256)),
        ],
    )


def test_a_bias_shared_by_two_layers_gets_a_copy_per_layer(model_file):
    loaded = ir.load_model(model_file(_shared_bias_gemms()))
    biases = [n.input[2] for n in loaded.graph.node if n.op_type == "Gemm"]
    assert len(set(biases)) == 2
    g = ir.Graph(loaded)
    np.testing.assert_array_equal(g.const_value(biases[0]), g.const_value(biases[1]))
    assert ir.unshare_biases(loaded.graph) == 0  # nothing shared any more
