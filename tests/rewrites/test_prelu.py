"""decompose_prelu: a constant-slope PRelu on a large (or dynamic) tensor becomes
Relu + Min * slope + Add, bit-exact in onnxruntime; small static tensors keep the one op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq.rewrites.prelu import MIN_ELEMENTS, decompose_prelu
from tests import graphs
from tests.rewrites.test_simplify import apply, run


def prelu(shape: list[int | str], slope_shape: tuple[int, ...] = (16, 1, 1),
          const_slope: bool = True) -> onnx.ModelProto:
    """x -> PRelu(slope, some channels negative) -> Relu -> y."""
    slope = np.linspace(-0.5, 0.8, int(np.prod(slope_shape)), dtype=np.float32)
    inits = [graphs.init("slope", slope.reshape(slope_shape))] if const_slope else []
    inputs = [graphs.tensor("x", shape)]
    if not const_slope:
        inputs.append(graphs.tensor("slope", list(slope_shape)))
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["p"], name="prelu"),
             helper.make_node("Sigmoid", ["p"], ["y"], name="tail")]
    return graphs.model(nodes, inputs, [graphs.tensor("y", shape)], inits)


def assert_bit_exact(before: onnx.ModelProto, after: onnx.ModelProto, shape: list[int]) -> None:
    r = graphs.rng(5)
    x = (r.standard_normal(shape) * 3).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 1e-30, -1e-30]
    feed = {"x": x}
    for want, got in zip(run(before, feed), run(after, feed), strict=True):
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    ("shape", "slope_shape"),
    [([1, 16, 24, 24], (16, 1, 1)), (["n", 16, "h", "w"], (16, 1, 1)), (["n", 8192], (8192,)),
     ([1, 16, 24, 24], (1,))],
)
def test_decompose_prelu_rewrites_large_or_dynamic_tensors_exactly(shape, slope_shape):
    before = prelu(shape, slope_shape)
    after, modified = apply(decompose_prelu, before)
    assert modified
    assert graphs.op_types(after) == ["Relu", "Min", "Mul", "Add", "Sigmoid"]
    assert after.graph.node[3].output[0] == "p"  # the PRelu's output keeps its name
    concrete = [d if isinstance(d, int) else 3 for d in shape]
    assert_bit_exact(before, after, concrete)


def test_decompose_prelu_keeps_a_small_static_tensor():
    before = prelu([1, 16, 4, 4])
    assert MIN_ELEMENTS > 16 * 4 * 4
    after, modified = apply(decompose_prelu, before)
    assert not modified and graphs.op_types(after) == ["PRelu", "Sigmoid"]


def test_decompose_prelu_keeps_a_slope_that_is_not_a_constant():
    before = prelu([1, 16, 24, 24], const_slope=False)
    after, modified = apply(decompose_prelu, before)
    assert not modified and graphs.op_types(after) == ["PRelu", "Sigmoid"]
