"""decompose_prelu: a constant-slope PRelu on a large (or dynamic) tensor becomes
Max(x, x * slope) (every slope <= 1) or Relu + Min * slope + Add, bit-exact in onnxruntime;
small static tensors keep the one op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxq.prepare.prelu import MIN_ELEMENTS, MIN_ELEMENTS_MAX, decompose_prelu
from tests import graphs
from tests.prepare.test_simplify import apply, run


def prelu(
    shape: list[int | str],
    slope_shape: tuple[int, ...] = (16, 1, 1),
    const_slope: bool = True,
    top: float = 0.8,
) -> onnx.ModelProto:
    """x -> PRelu(slope from -0.5 to ``top``, some channels negative) -> Sigmoid -> y."""
    slope = np.linspace(-0.5, top, int(np.prod(slope_shape)), dtype=np.float32)
    inits = [graphs.init("slope", slope.reshape(slope_shape))] if const_slope else []
    inputs = [graphs.tensor("x", shape)]
    if not const_slope:
        inputs.append(graphs.tensor("slope", list(slope_shape)))
    nodes = [
        helper.make_node("PRelu", ["x", "slope"], ["p"], name="prelu"),
        helper.make_node("Sigmoid", ["p"], ["y"], name="tail"),
    ]
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
    [
        ([1, 16, 24, 24], (16, 1, 1)),
        (["n", 16, "h", "w"], (16, 1, 1)),
        (["n", 8192], (8192,)),
        ([1, 16, 24, 24], (1,)),
        ([1, 16, 8, 8], (16, 1, 1)),
    ],
)
def test_slopes_up_to_one_become_max_of_x_and_its_product_exactly(shape, slope_shape):
    before = prelu(shape, slope_shape, top=1.0)
    after, modified = apply(decompose_prelu, before)
    assert modified
    assert graphs.op_types(after) == ["Mul", "Max", "Sigmoid"]
    assert after.graph.node[1].output[0] == "p"  # the PRelu's output keeps its name
    concrete = [d if isinstance(d, int) else 3 for d in shape]
    assert_bit_exact(before, after, concrete)


@pytest.mark.parametrize(
    ("shape", "slope_shape"),
    [([1, 16, 24, 24], (16, 1, 1)), (["n", 16, "h", "w"], (16, 1, 1)), (["n", 8192], (8192,))],
)
def test_a_slope_above_one_takes_relu_plus_scaled_min_exactly(shape, slope_shape):
    before = prelu(shape, slope_shape, top=1.5)
    after, modified = apply(decompose_prelu, before)
    assert modified
    assert graphs.op_types(after) == ["Relu", "Min", "Mul", "Add", "Sigmoid"]
    assert after.graph.node[3].output[0] == "p"
    concrete = [d if isinstance(d, int) else 3 for d in shape]
    assert_bit_exact(before, after, concrete)


@pytest.mark.parametrize(("shape", "top"), [([1, 16, 4, 4], 0.8), ([1, 16, 12, 12], 1.5)])
def test_decompose_prelu_keeps_a_small_static_tensor(shape, top):
    per_sample = int(np.prod(shape[1:]))
    assert per_sample < (MIN_ELEMENTS_MAX if top <= 1 else MIN_ELEMENTS)
    before = prelu(shape, top=top)
    after, modified = apply(decompose_prelu, before)
    assert not modified and graphs.op_types(after) == ["PRelu", "Sigmoid"]


def test_decompose_prelu_keeps_a_slope_that_is_not_finite():
    before = prelu([1, 16, 24, 24])
    before.graph.initializer[0].CopyFrom(
        graphs.init("slope", np.full((16, 1, 1), np.nan, dtype=np.float32))
    )
    after, modified = apply(decompose_prelu, before)
    assert not modified and graphs.op_types(after) == ["PRelu", "Sigmoid"]


def test_decompose_prelu_keeps_a_slope_that_is_not_a_constant():
    before = prelu([1, 16, 24, 24], const_slope=False)
    after, modified = apply(decompose_prelu, before)
    assert not modified and graphs.op_types(after) == ["PRelu", "Sigmoid"]
