"""onnxq.pytorch.exporters: dynamo's nodes renamed to TorchScript's scope names."""

from __future__ import annotations

from onnx import helper

from onnxq.pytorch.exporters import scope_node_names


def test_dynamo_nodes_take_torchscript_scope_names():
    nodes = [helper.make_node("Conv", ["x", "w"], [f"y{i}"], name=f"conv{i}") for i in range(2)]
    for node in nodes:
        node.metadata_props.add(
            key="pkg.torch.onnx.name_scopes", value="['', 'features', 'features.0', 'conv']"
        )
    graph = helper.make_graph(nodes, "g", [], [])
    model = helper.make_model(graph)
    scope_node_names(model)
    names = [n.name for n in model.graph.node]
    assert names[1] == names[0] + "_1" and names[0].endswith("/Conv")
    assert names[0].startswith("/features/")
