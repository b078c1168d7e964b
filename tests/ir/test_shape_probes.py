"""onnxq.ir.shape_probes: shapes with the dynamic input dimensions set to probe sizes."""

from __future__ import annotations

from onnx import TensorProto, helper

from onnxq import ir
from onnxq.ir.shape_probes import PROBE_SIZES, probe_shapes, symbolic_input_dims


def _relu(shape: list) -> ir.Graph:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return ir.Graph(ir.infer_shapes(model))


def test_each_symbol_gets_its_own_size_in_each_probe():
    graph = _relu([1, "H", "W", "H"])
    shapes, symbols = symbolic_input_dims(graph)
    assert shapes == {"x": [1, "H", "W", "H"]} and symbols == {"H": 0, "W": 1}
    probes = probe_shapes(graph)
    assert len(probes) == len(PROBE_SIZES)
    assert probes[0]["y"] == (1, 256, 288, 256) and probes[1]["y"] == (1, 384, 448, 384)


def test_a_static_model_has_no_probes():
    assert probe_shapes(_relu([1, 4])) == []
