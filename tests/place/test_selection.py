"""User selections beyond node-name globs: tensor names, op types, exporter modules."""

from __future__ import annotations

import onnx
from onnx import helper

import onnxq
from onnxq.config import QuantConfig
from onnxq.place.selection import node_modules, select
from tests import graphs


def _with_modules(model: onnx.ModelProto, modules: dict[str, list[str]]) -> onnx.ModelProto:
    """Write torch.onnx dynamo-style module metadata onto the named nodes."""
    for node in model.graph.node:
        if node.name in modules:
            scopes = ["", *modules[node.name]]
            helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": repr(scopes)})
    return model


def test_module_paths_come_from_name_scopes_or_namespace():
    node = helper.make_node("Relu", ["a"], ["b"], name="n")
    helper.set_metadata_props(
        node, {"namespace": ": M/encoder.0: Block/encoder.0.attn: Attn/softmax: aten.softmax"}
    )
    assert node_modules(node) == ("encoder.0", "encoder.0.attn", "softmax")
    del node.metadata_props[:]
    helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": "['', 'enc.1', 'enc.1.q']"})
    assert node_modules(node) == ("enc.1", "enc.1.q")
    del node.metadata_props[:]
    assert node_modules(node) == ()


def test_a_tensor_name_keeps_its_producer_float_and_says_which_node():
    model = graphs.residual_add()
    cfg = QuantConfig(exclude=("conv2_out",))
    selection = select(model.graph.node, cfg.placement)
    assert list(selection.nodes) == ["conv2"]
    assert "tensor 'conv2_out'" in selection.nodes["conv2"]
    assert "'conv2_out' -> node 'conv2' (Conv)" in selection.notes[0]
    batches = graphs.random_batches(model, 2)
    result = onnxq.quantize(model, batches, exclude=["conv2_out"], progress=False)
    decision = next(d for d in result.report.decisions if d.node == "conv2")
    assert not decision.quantized and "conv2_out" in decision.reason
    assert not any("matches no node" in w for w in result.report.warnings)
    assert any("node 'conv2'" in n for n in result.report.notes)


def test_op_type_and_module_globs_keep_their_nodes_float():
    model = _with_modules(
        graphs.residual_add(), {"conv1": ["encoder.0", "encoder.0.attn"], "conv2": ["head"]}
    )
    batches = graphs.random_batches(model, 2)
    result = onnxq.quantize(model, batches, progress=False, exclude_modules=("encoder.*.attn*",))
    reasons = {d.node: (d.quantized, d.reason) for d in result.report.decisions}
    assert reasons["conv1"] == (
        False,
        "excluded by --exclude-module encoder.*.attn* (module encoder.0.attn)",
    )
    assert reasons["conv2"][0]
    result = onnxq.quantize(model, batches, progress=False, exclude_op_types=("Co*",))
    assert all(
        not d.quantized and d.reason == "excluded by --exclude-op-type Co*"
        for d in result.report.decisions
        if d.op_type == "Conv"
    )


def test_torchscript_scopes_select_a_module_without_metadata():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="/features/features.3/conv/Relu")]
    cfg = QuantConfig(exclude_modules=("features.3",))
    assert "/features/features.3/conv/Relu" in select(nodes, cfg.placement).nodes


def test_torchscript_scopes_of_module_list_children_select_their_module():
    """A ModuleList is iterated, never called, so it has no scope of its own: a transformer's
    layer ``model.layers.0`` is the scope ``/model/layers.0`` (a Sequential child is
    ``/features/features.3``)."""
    names = [
        "/model/layers.0/mlp/gate_proj/MatMul",
        "/model/layers.1/mlp/gate_proj/MatMul",
        "/model/layers.0/self_attn/q_proj/MatMul",
        "/encoder/layer.10/attention/self/query/MatMul",
        "/features/features.3/features.3.0/Conv",
        "/Add",
    ]
    nodes = [helper.make_node("Relu", ["x"], ["y"], name=name) for name in names]

    def chosen(*patterns: str) -> list[str]:
        return sorted(select(nodes, QuantConfig(exclude_modules=patterns).placement).nodes)

    assert chosen("model.layers.0.mlp*") == ["/model/layers.0/mlp/gate_proj/MatMul"]
    assert chosen("model.layers.*.mlp") == sorted(names[:2])
    assert chosen("*.self_attn") == ["/model/layers.0/self_attn/q_proj/MatMul"]
    assert chosen("encoder.layer.10.attention.self") == [names[3]]
    assert chosen("features.3.0") == [names[4]]
    assert chosen("layers.0") == []  # a module path starts at the exported module's children


def test_selections_that_match_nothing_are_said():
    cfg = QuantConfig(exclude_op_types=("Sofmax",), exclude_modules=("nowhere",))
    notes = select(graphs.residual_add().graph.node, cfg.placement).notes
    assert any("--exclude-op-type 'Sofmax' matches no node" in n for n in notes)
    assert any("--exclude-module 'nowhere' matches no node" in n for n in notes)


def test_cli_selection_flags(tmp_path, calib_dir, capsys):
    from onnxq.cli import main

    model = graphs.residual_add()
    f = tmp_path / "f.onnx"
    onnx.save(model, f)
    assert main(["explain", str(f), "--exclude-op-type", "Conv"]) == 0
    out = capsys.readouterr().out
    assert "excluded by --exclude-op-type Conv" in out
