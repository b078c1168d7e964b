"""``onnxq explain`` sees the graph ``onnxq quantize`` places: the same first half of the run."""

from __future__ import annotations

import pytest

import onnxq
from onnxq.cli import main
from tests import graphs


def _explained(capsys) -> dict[str, tuple[bool, str]]:
    """Node -> (quantized, rule) from explain's output (the rule: "" for a float node)."""
    lines = capsys.readouterr().out.splitlines()
    out = {}
    for line in lines[: next(i for i, x in enumerate(lines) if " ops quantized for " in x)]:
        node, _op, what = line.split(None, 2)
        quantized = what.startswith("quantized by ")
        out[node] = (quantized, what.split()[2].rstrip(":") if quantized else "")
    return out


@pytest.mark.parametrize("build", [graphs.conv_bn_relu, graphs.with_constant_nodes])
@pytest.mark.parametrize("simplify", [True, False])
def test_explain_decides_each_node_as_quantize_reports_it(
    tmp_path, model_file, calib_dir, capsys, build, simplify
):
    """A BatchNormalization that prepare folds into its Conv, or Constant-node weights that it
    folds, stay in the graph with ``simplify: false``: explain lists the nodes quantize places
    and decides each one as the quantize report does (before, it simplified regardless)."""
    m = build()
    config = tmp_path / "config.yaml"
    config.write_text(f"simplify: {str(simplify).lower()}\ncle: true\n")
    assert main(["explain", str(model_file(m)), "--config", str(config)]) == 0
    explained = _explained(capsys)
    run = onnxq.quantize(m, calib_dir(m, n=3), config=str(config), progress=False)
    reported = {d.node: (d.quantized, d.rule if d.quantized else "") for d in run.report.decisions}
    assert explained == reported
    assert explained["conv"] == (True, "conv")
    assert ("bn" in explained) == (build is graphs.conv_bn_relu and not simplify)
