"""fuse_hardswish: the decomposed x * Clip(x + 3, 0, 6) / 6 becomes HardSigmoid + Mul (or
HardSwish from opset 14), only when every intermediate belongs to the pattern; outputs stay equal
in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq.prepare.hardswish import fuse_hardswish
from onnxq.prepare.simplify import simplify
from tests import graphs
from tests.prepare.test_simplify import apply, assert_same_outputs, run

SHAPE = [1, 8, 4, 4]


def decomposed(
    form: str = "div",
    opset: int = 13,
    swap: bool = False,
    three: float = 3.0,
    high: float = 6.0,
    six: float = 6.0,
    mul_x: str = "x",
    extra_output: str | None = None,
    conv: bool = True,
) -> onnx.ModelProto:
    """x -> Conv -> hardswish written as Add, Clip, Mul and a division by ``six`` -> Relu -> y
    (without ``conv``, the hardswish reads the graph input ``x`` itself).

    ``form``: ``div`` (x*c)/6, ``mul`` (x*c)*(1/6), ``gate_div`` x*(c/6), ``gate_mul``
    x*(c*(1/6)).  ``swap`` reverses the operands of the Add and the Muls.
    """
    r = graphs.rng(0)

    def pair(a: str, b: str) -> list[str]:
        return [b, a] if swap else [a, b]

    nodes = [helper.make_node("Conv", ["inp", "w"], ["x"], name="conv", pads=[1, 1, 1, 1])]
    inits = [graphs.init("w", graphs.weight(r, 8, 8, 3, 3, scale=0.5))]
    if not conv:
        nodes, inits = [], []
    inits += [
        graphs.init("three", np.array(three, np.float32)),
        graphs.init("six", np.array(six, np.float32)),
        graphs.init("sixth", np.array(1.0 / six, np.float32)),
    ]
    nodes.append(helper.make_node("Add", pair("x", "three"), ["plus3"], name="add"))
    if opset >= 11:
        inits += [
            graphs.init("lo", np.array(0.0, np.float32)),
            graphs.init("hi", np.array(high, np.float32)),
        ]
        nodes.append(helper.make_node("Clip", ["plus3", "lo", "hi"], ["clipped"], name="clip"))
    else:
        nodes.append(
            helper.make_node("Clip", ["plus3"], ["clipped"], name="clip", min=0.0, max=high)
        )
    if form in ("div", "mul"):
        nodes.append(helper.make_node("Mul", pair(mul_x, "clipped"), ["prod"], name="mul"))
        last = (
            helper.make_node("Div", ["prod", "six"], ["hs"], name="div")
            if form == "div"
            else helper.make_node("Mul", pair("prod", "sixth"), ["hs"], name="scale")
        )
        nodes.append(last)
    else:
        scale = (
            helper.make_node("Div", ["clipped", "six"], ["gate"], name="div")
            if form == "gate_div"
            else helper.make_node("Mul", pair("clipped", "sixth"), ["gate"], name="scale")
        )
        nodes += [scale, helper.make_node("Mul", pair(mul_x, "gate"), ["hs"], name="mul")]
    nodes.append(helper.make_node("Relu", ["hs"], ["y"], name="relu"))
    outputs = [graphs.tensor("y", SHAPE)]
    if extra_output:
        outputs.append(graphs.tensor(extra_output, SHAPE))
    inputs = [graphs.tensor("inp" if conv else "x", SHAPE)]
    if mul_x != "x":
        inputs.append(graphs.tensor(mul_x, SHAPE))
    return graphs.model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("form", ["div", "mul", "gate_div", "gate_mul"])
@pytest.mark.parametrize("swap", [False, True])
def test_fuse_hardswish_matches_every_form(form, swap):
    before = decomposed(form, swap=swap)
    after, modified = apply(fuse_hardswish, before)
    assert modified
    assert graphs.op_types(after) == ["Conv", "HardSigmoid", "Mul", "Relu"]
    hs = after.graph.node[1]
    attrs = {a.name: a.f for a in hs.attribute}
    assert attrs == {"alpha": pytest.approx(1 / 6), "beta": pytest.approx(0.5)}
    assert list(after.graph.node[2].input) == ["x", hs.output[0]]
    assert after.graph.node[2].output[0] == "hs"  # the pattern's output keeps its name
    assert_same_outputs(before, after)


def test_fuse_hardswish_reads_clip_bounds_from_attributes_before_opset_11():
    before = decomposed(opset=10)
    after, modified = apply(fuse_hardswish, before)
    assert modified and graphs.op_types(after) == ["Conv", "HardSigmoid", "Mul", "Relu"]
    assert_same_outputs(before, after)


def test_fuse_hardswish_writes_one_hardswish_from_opset_14():
    before = decomposed(opset=14)
    after, modified = apply(fuse_hardswish, before)
    assert modified and graphs.op_types(after) == ["Conv", "HardSwish", "Relu"]
    assert_same_outputs(before, after)


def test_fuse_hardswish_values_match_at_the_kinks():
    # at -3 and 3 the clip switches, at -1.5 hardswish has its minimum
    before = decomposed(conv=False, extra_output="hs")  # the hardswish itself is an output
    after, modified = apply(fuse_hardswish, before)
    assert modified and graphs.op_types(after) == ["HardSigmoid", "Mul", "Relu"]
    values = np.array([-4.0, -3.0, -2.0, -1.5, 0.0, 1e-3, 3.0, 6.0], np.float32)
    feed = {"x": np.resize(values, SHAPE).astype(np.float32)}
    (_, want), (_, got) = run(before, feed), run(after, feed)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    expected = feed["x"] * np.clip(feed["x"] + 3, 0, 6) / 6
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert want.min() < 0  # the negative dip is compared, not hidden behind the Relu


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"three": 2.0}, "adds 2, not 3"),
        ({"high": 5.0}, "clips at 5, not 6"),
        ({"six": 5.0}, "divides by 5"),
        ({"mul_x": "other"}, "multiplies another tensor than the clip's input"),
        ({"extra_output": "clipped"}, "an intermediate is a graph output"),
        ({"extra_output": "prod"}, "the product is a graph output"),
    ],
)
def test_fuse_hardswish_declines_near_misses(options, why):
    before = decomposed(**options)
    after, modified = apply(fuse_hardswish, before)
    assert not modified, why
    assert graphs.op_types(after) == graphs.op_types(before)


def test_fuse_hardswish_declines_when_an_intermediate_has_another_reader():
    before = decomposed()
    extra = helper.make_node("Sigmoid", ["plus3"], ["side"], name="side")
    model = graphs.model(
        [*before.graph.node, extra],
        before.graph.input,
        [*before.graph.output, graphs.tensor("side", SHAPE)],
        before.graph.initializer,
    )
    after, modified = apply(fuse_hardswish, model)
    assert not modified and graphs.count_ops(after, "Clip") == 1


def test_simplify_runs_fuse_hardswish():
    before = decomposed("gate_mul", swap=True)
    after, passes = simplify(before)
    assert "fuse_hardswish" in passes
    assert graphs.op_types(after) == ["Conv", "HardSigmoid", "Mul", "Relu"]
    assert_same_outputs(before, after)
