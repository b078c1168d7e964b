"""fold_pad: a zero, spatial-only Pad in front of Convs moves into their pads (bit-exact); a
Pad that pads nothing disappears; anything else stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq import ir
from onnxq.prepare.pad import fold_pad
from tests import graphs
from tests.prepare.test_simplify import apply, run


def padded_conv(
    pads: list[int],
    *,
    fill: float | None = None,
    mode: str = "constant",
    conv_pads: list[int] | None = None,
    auto_pad: str | None = None,
    extra_reader: str | None = None,
    opset: int = 17,
    axes: list[int] | None = None,
    pad_is_output: bool = False,
) -> onnx.ModelProto:
    """x[1, 4, 9, 9] -> Pad -> Conv(3x3, 4 -> 6, stride 2) -> y (and optionally another
    reader of the padded tensor)."""
    r = graphs.rng(3)
    inits = [graphs.init("w", graphs.weight(r, 6, 4, 3, 3)), graphs.init("b", graphs.weight(r, 6))]
    attrs: dict[str, object] = {"mode": mode}
    if opset < 11:
        attrs["pads"] = pads
        if fill is not None:
            attrs["value"] = fill
        pad = helper.make_node("Pad", ["x"], ["p"], name="pad", **attrs)
    else:
        inputs = ["x", "pads"]
        inits.append(graphs.init("pads", np.array(pads, dtype=np.int64)))
        if fill is not None or axes is not None:
            inputs.append("fill" if fill is not None else "")
            if fill is not None:
                inits.append(graphs.init("fill", np.array(fill, dtype=np.float32)))
        if axes is not None:
            inputs.append("axes")
            inits.append(graphs.init("axes", np.array(axes, dtype=np.int64)))
        pad = helper.make_node("Pad", inputs, ["p"], name="pad", mode=mode)
    conv_attrs: dict[str, object] = {"kernel_shape": [3, 3], "strides": [2, 2]}
    if conv_pads is not None:
        conv_attrs["pads"] = conv_pads
    if auto_pad is not None:
        conv_attrs["auto_pad"] = auto_pad
    nodes = [pad, helper.make_node("Conv", ["p", "w", "b"], ["y"], name="conv", **conv_attrs)]
    outputs = [graphs.tensor("y", ["n", "c", "h", "w"])]
    if extra_reader:
        nodes.append(helper.make_node(extra_reader, ["p"], ["z"], name="other"))
        outputs.append(graphs.tensor("z", ["n", "c", "h2", "w2"]))
    if pad_is_output:
        outputs.append(graphs.tensor("p", ["n", "c", "h2", "w2"]))
    return graphs.model(nodes, [graphs.tensor("x", [1, 4, 9, 9])], outputs, inits, opset=opset)


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    x = graphs.rng(7).standard_normal((1, 4, 9, 9)).astype(np.float32)
    for want, got in zip(run(before, {"x": x}), run(after, {"x": x}), strict=True):
        assert np.array_equal(got, want)


def conv_pads(model: onnx.ModelProto) -> list[int]:
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    return list(ir.node_attrs(conv).get("pads", []))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"pads": [0, 0, 1, 1, 0, 0, 1, 1]}, [1, 1, 1, 1]),
        ({"pads": [0, 0, 0, 0, 0, 0, 1, 1]}, [0, 0, 1, 1]),  # TF "same": bottom/right only
        ({"pads": [0, 0, 1, 2, 0, 0, 0, 1], "conv_pads": [1, 0, 1, 0]}, [2, 2, 1, 1]),
        ({"pads": [0, 0, 1, 1, 0, 0, 1, 1], "fill": 0.0}, [1, 1, 1, 1]),
        ({"pads": [0, 0, 1, 1, 0, 0, 1, 1], "opset": 10}, [1, 1, 1, 1]),  # attribute pads
        ({"pads": [1, 2, 1, 0], "axes": [2, 3], "opset": 18}, [1, 2, 1, 0]),  # opset-18 axes
    ],
)
def test_a_zero_spatial_pad_moves_into_the_conv_bit_exactly(kwargs, expected):
    before = padded_conv(**kwargs)
    after, modified = apply(fold_pad, before)
    assert modified
    assert graphs.op_types(after) == ["Conv"]
    assert after.graph.node[0].input[0] == "x"
    assert conv_pads(after) == expected
    assert_same_outputs(before, after)


def test_a_pad_that_pads_nothing_disappears_whatever_reads_it():
    before = padded_conv([0] * 8, extra_reader="Relu")
    after, modified = apply(fold_pad, before)
    assert modified
    assert graphs.op_types(after) == ["Conv", "Relu"]
    assert all(n.input[0] == "x" for n in after.graph.node)
    assert_same_outputs(before, after)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "fill": 1.0},  # not zero
        {"pads": [0, 1, 1, 1, 0, 0, 1, 1]},  # pads a channel
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "reflect"},
        {"pads": [0, 0, -1, 0, 0, 0, 1, 1]},  # crops
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "extra_reader": "Relu"},  # another reader
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "auto_pad": "SAME_UPPER"},
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "pad_is_output": True},
        {"pads": [0] * 8, "pad_is_output": True},
    ],
)
def test_other_pads_stay(kwargs):
    before = padded_conv(**kwargs)
    after, modified = apply(fold_pad, before)
    assert not modified
    assert "Pad" in graphs.op_types(after)


def test_simplify_runs_fold_pad():
    from onnxq.prepare.simplify import simplify

    before = padded_conv([0, 0, 1, 1, 0, 0, 1, 1])
    after, fired = simplify(before)
    assert "fold_pad" in fired and graphs.op_types(after) == ["Conv"]
