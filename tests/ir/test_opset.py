"""Opset upgrades keep what the version converter drops: node metadata (module scopes)."""

from __future__ import annotations

import onnx

from onnxq.ir.opset import opset_version, upgrade_opset
from tests import graphs


def test_an_upgrade_keeps_each_nodes_metadata_props():
    m = graphs.residual_add()
    m.opset_import[0].version = 13
    first = m.graph.node[0]
    entry = onnx.StringStringEntryProto(key="pkg.torch.onnx.name_scopes", value="['encoder']")
    first.metadata_props.append(entry)
    up = upgrade_opset(m, 19)
    assert opset_version(up) == 19
    (node,) = (n for n in up.graph.node if n.name == first.name)
    assert [(p.key, p.value) for p in node.metadata_props] == [(entry.key, entry.value)]
    assert all(not n.metadata_props for n in up.graph.node if n.name != first.name)
