"""What analyze suggests per quantized op, from what dominates its local error."""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.analyze.advice import advise, weight_sqnr_db
from onnxq.analyze.compare import LayerError
from onnxq.analyze.error_stats import ErrorSums
from tests import graphs


def _layer(op: str, weight: float | None, inputs: float | None, offset: float = 0.0):
    return LayerError(
        "t", "node", op, 0.99, 0.1, quantized=True, local_sqnr_db=20.0,
        input_sqnr_db=inputs, weight_sqnr_db=weight, offset_share=offset,
    )  # fmt: skip


def _input(peak: float, rms: float) -> ErrorSums:
    return ErrorSums(ref=rms * rms * 100, count=100, peak=peak)


@pytest.mark.parametrize(
    ("op", "weight", "inputs", "offset", "peak", "expected"),
    [
        ("Conv", 30.0, 40.0, 0.5, 1.0, "try --bias-correction"),
        ("Conv", 20.0, 40.0, 0.0, 1.0, "try --cle"),
        ("Gemm", 20.0, 40.0, 0.0, 1.0, "try --adaround"),
        ("MatMul", 40.0, 20.0, 0.0, 100.0, "try --smoothquant"),
        ("MatMul", 40.0, 20.0, 0.0, 2.0, "try --method-for 'node=mse'"),
        ("Add", None, 20.0, 0.0, 2.0, "try --method-for 'node=mse'"),
        ("Conv", 30.0, 31.0, 0.0, 1.0, None),  # neither dominates: keep it float
    ],
)
def test_the_dominant_noise_picks_the_suggestion(op, weight, inputs, offset, peak, expected):
    text = advise(_layer(op, weight, inputs, offset), ErrorSums(), [_input(peak, 1.0)])
    assert text.endswith("--exclude 'node' keeps it float")
    if expected is None:
        assert text.startswith("--exclude")
    else:
        assert expected in text


def test_weight_sqnr_is_the_rounding_noise_of_the_scale():
    import onnxq
    from onnxq import ir

    model = graphs.conv_relu()
    quant = onnxq.quantize(model, graphs.random_batches(model, 2), progress=False).model
    graph = ir.Graph(quant)
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    dq = graph.producer[conv.input[1]]
    q, scale = graph.const_value(dq.input[0]), graph.const_value(dq.input[1])
    values = q.astype(np.float64) * scale.reshape(-1, 1, 1, 1)
    noise = (scale.astype(np.float64) ** 2 / 12).sum() * q[0].size
    expected = 10 * np.log10((values**2).sum() / noise)
    assert weight_sqnr_db(graph, conv) == pytest.approx(expected)
    relu = next(n for n in graph.nodes if n.op_type == "Relu")
    assert weight_sqnr_db(graph, relu) is None


def test_a_relu_input_on_the_symmetric_grid_suggests_the_shift():
    layer = _layer("Conv", 40.0, 20.0)
    half = LayerError(**{**layer.__dict__, "input_half_grid": True})
    assert "try --shift-activations" in advise(half, ErrorSums(), [_input(2.0, 1.0)])
    assert "try --shift-activations" not in advise(layer, ErrorSums(), [_input(2.0, 1.0)])


@pytest.mark.parametrize(
    ("backend", "shift", "expected"),
    [("tensorrt", False, True), ("tensorrt", True, False), ("onnxruntime", False, False)],
)
def test_half_grid_input_is_an_unshifted_relu_output_with_zero_point_0(backend, shift, expected):
    import onnxq
    from onnxq import ir
    from onnxq.analyze.advice import half_grid_input
    from tests.recover.builders import conv_chain, image_batches

    model = conv_chain()
    quant = onnxq.quantize(
        model,
        image_batches(model),
        backend=backend,
        shift_activations=shift,
        min_channels=0,
        weak_channel_fraction=1.0,
        progress=False,
    ).model
    graph = ir.Graph(quant)
    nodes = {n.name: n for n in graph.nodes}
    assert half_grid_input(graph, nodes["conv2"]) is expected  # reads relu1's output
    assert half_grid_input(graph, nodes["conv1"]) is False  # reads the graph input
