"""analyze's comparison model (float + accumulated + local copies of the Q/DQ model)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import onnxq
from onnxq import ir
from tests import graphs


def _kv_cache_step() -> onnx.ModelProto:
    """A decoder step: ``present = Concat(past, x W)``, declared (as hand-written dynamic axes
    of a KV-cache export often are) with the past input's length symbol although it is
    longer; ``y = (x W) present^T``.  ``relu(past)`` dies before the Concat, so onnxruntime
    has a free ``[b, p, 32]`` buffer to give a tensor it believes has that shape."""
    r = graphs.rng(0)
    nodes = [
        helper.make_node("Relu", ["past"], ["past_relu"], name="past_relu"),
        helper.make_node("ReduceMean", ["past_relu"], ["mean"], name="mean", axes=[1]),
        helper.make_node("Add", ["x", "mean"], ["x_mean"], name="x_mean"),
        helper.make_node("MatMul", ["x_mean", "w"], ["h"], name="k_proj"),
        helper.make_node("Concat", ["past", "h"], ["present"], name="cache", axis=1),
        helper.make_node("Transpose", ["present"], ["keys"], name="keys", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "keys"], ["y"], name="scores"),
    ]
    return graphs.model(
        nodes,
        [graphs.tensor("x", ["b", "s", 32]), graphs.tensor("past", ["b", "p", 32])],
        [graphs.tensor("present", ["b", "p", 32]), graphs.tensor("y", ["b", "s", "total"])],
        [graphs.init("w", graphs.weight(r, 32, 32))],
    )


def test_a_graph_outputs_declared_shape_does_not_reach_the_copies():
    """onnxruntime checks a graph output's declared shape loosely but plans buffers from a
    tensor's value info: the quantized copies' ``present`` (an inner tensor of the comparison
    model) must not carry the output's stale ``[b, p, 32]`` (a Hugging Face Phi-3 KV-cache
    export made ``onnxq analyze`` fail: "Shape mismatch attempting to re-use buffer")."""
    model = _kv_cache_step()
    r = np.random.default_rng(1)
    batch = {
        "x": r.standard_normal((2, 3, 32)).astype(np.float32),
        "past": r.standard_normal((2, 5, 32)).astype(np.float32),
    }
    quant = onnxq.quantize(model, [batch] * 3, progress=False).model
    twin = ir.twin_model(model, quant).model
    del twin.graph.output[:]  # one group of analyze's tensors: the copies' y only
    wanted = [ir.Twin.accumulated("y"), ir.Twin.local("y")]
    twin.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in wanted)
    session = ort.InferenceSession(twin.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, batch)
    want = ort.InferenceSession(model.SerializeToString()).run(["y"], batch)[0]
    for value in got:
        assert value.shape == (2, 3, 8)
        assert np.abs(value - want).max() < 0.05 * np.abs(want).max()


def test_a_shifted_activation_is_quantized_from_the_float_tensor_in_the_local_copy():
    """``shift_activations`` puts ``Sub(x, c)`` (and a Pad) ahead of the QuantizeLinear: the
    local copy's Sub must read the float ``x``, as its QuantizeLinear would, or the reader's
    local error would carry the ops before it."""
    from tests.recover.builders import conv_chain, image_batches

    model = conv_chain()
    batches = image_batches(model)
    quant = onnxq.quantize(
        model,
        batches,
        backend="tensorrt",
        shift_activations=True,
        min_channels=0,
        weak_channel_fraction=1.0,
        progress=False,
    ).model
    twin = ir.twin_model(model, quant)
    producer = {o: n for n in twin.model.graph.node for o in n.output}

    def source(name: str) -> str:
        # tensorrt's default output computes the Sub in FP16: the local copy's Sub reads the
        # float tensor through a Cast to FP16, as the quantized model's Sub reads its input
        cast = producer.get(name)
        if cast is None or cast.op_type != "Cast":
            return name
        assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT16
        return cast.input[0]

    subs = [n for n in twin.model.graph.node if n.op_type == "Sub"]
    reads = sorted(source(n.input[0]) for n in subs)
    assert reads == sorted(["r1", "r2", ir.Twin.accumulated("r1"), ir.Twin.accumulated("r2")])
    assert not set(twin.fake_quantized.values()) & {"r1", "r2"}  # x - c is not r1 or r2
    local = ir.Twin.local("y")
    twin.model.graph.output.append(helper.make_empty_tensor_value_info(local))
    session = ort.InferenceSession(
        twin.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got, want = session.run([local, "y"], batches[0])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_models_own_sub_before_a_quantized_conv_keeps_its_local_input():
    r = graphs.rng(0)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sub", ["r", "c"], ["s"], name="sub"),
        helper.make_node("Conv", ["s", "w"], ["y"], name="conv"),
    ]
    inits = [graphs.init("c", np.float32(0.5)), graphs.init("w", graphs.weight(r, 16, 16, 1, 1))]
    model = graphs.model(
        nodes, [graphs.tensor("x", [1, 16, 4, 4])], [graphs.tensor("y", [1, 16, 4, 4])], inits
    )
    quant = onnxq.quantize(
        model, graphs.random_batches(model), backend="tensorrt", shift_activations=True,
        min_channels=0, progress=False,
    ).model  # fmt: skip
    twin = ir.twin_model(model, quant).model
    (local_sub,) = [n for n in twin.graph.node if n.name == "sub" + ir.LOCAL]
    assert local_sub.input[0] == ir.Twin.local("r")


def test_a_shifted_graph_output_is_read_from_the_float_tensor_too():
    """An activation that is also a graph output is written in FP16 as ``r1_fp16`` and cast
    back to ``r1`` (the output keeps its name and type); the shift's Sub reads ``r1_fp16``:
    its local copy must still read the float ``r1`` (cast to FP16), not the local copy's own
    ``r1_fp16``, which carries the error of the ops before it."""
    from tests.recover.builders import conv_chain, image_batches

    model = ir.infer_shapes(conv_chain())
    model.graph.output.append(next(v for v in model.graph.value_info if v.name == "r1"))
    quant = onnxq.quantize(
        model, image_batches(model), backend="tensorrt", shift_activations=True,
        min_channels=0, weak_channel_fraction=1.0, progress=False,
    ).model  # fmt: skip
    (sub,) = [n for n in quant.graph.node if n.op_type == "Sub" and n.input[0] != "r2"]
    assert sub.input[0] == "r1_fp16"  # the FP16 Relu's output, cast back to the output r1
    twin = ir.twin_model(model, quant).model
    producer = {o: n for n in twin.graph.node for o in n.output}
    (local,) = [n for n in twin.graph.node if n.name == sub.name + ir.LOCAL]
    cast = producer[local.input[0]]
    assert cast.op_type == "Cast" and list(cast.input) == ["r1"]
    assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT16
