"""Sequential bias correction: each layer's mean output shift, measured with the layers before
it quantized and corrected, removed from its bias only when that lowers the model's output
error on the calibration data."""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli.recovery import add_recovery_flags, recovery_options
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.recover.outputs import OutputDrift
from onnxq.recover.sequential import (
    _passed,
    _significant_shift,
    correct_in_order,
    layers,
)
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import conv_chain, image_batches, placed


def one_conv(bias: np.ndarray | None = None) -> onnx.ModelProto:
    """``x -> Conv (1x1, 4 -> 3 channels, bias) -> y``."""
    r = rng(1)
    b = weight(r, 3) if bias is None else bias
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")]
    return model(
        nodes, [tensor("x", [2, 4, 5, 5])], [tensor("y", [2, 3, 5, 5])],
        [init("w", weight(r, 3, 4, 1, 1)), init("b", b)],
    )  # fmt: skip


def batches(n: int = 6) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(3)
    return [{"x": r.standard_normal((2, 4, 5, 5)).astype(np.float32)} for _ in range(n)]


def test_a_constant_shift_is_significant_and_noise_is_not():
    r = np.random.default_rng(0)
    noise = r.standard_normal((20, 4)) * 0.1
    shift, keep = _significant_shift(noise + np.array([1.0, 0.0, -0.5, 0.0]))
    np.testing.assert_allclose(shift, noise.mean(0) + np.array([1.0, 0.0, -0.5, 0.0]))
    assert keep.tolist() == [True, False, True, False]
    # a channel never in its active range in a batch (NaN) is left out of that batch
    with_gaps = np.full((5, 2), 2.0)
    with_gaps[::2, 1] = np.nan
    shift, keep = _significant_shift(with_gaps + r.standard_normal((5, 2)) * 1e-3)
    assert keep.all() and abs(shift[1] - 2.0) < 1e-2
    # one batch: no spread to judge by, nothing corrected
    assert not _significant_shift(np.ones((1, 3)))[1].any()


def test_a_shifted_copy_is_corrected_back_to_the_float_outputs():
    float_model = ir.infer_shapes(one_conv())
    offset = np.array([0.5, -0.25, 0.0], dtype=np.float32)

    def shifted(m: onnx.ModelProto) -> onnx.ModelProto:  # a "quantization" that adds a bias
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
        graph = ir.Graph(copy)
        b = graph.const_value("b")
        assert b is not None
        graph.set_initializer("b", b + offset)
        return copy

    data = batches()
    inputs = model_inputs(ir.Graph(float_model))
    # judged on the odd batches (the even ones measure the shift)
    judge = OutputDrift(float_model, data, inputs, None, 2**30, every=(2, 1))
    before = judge(shifted(float_model))
    target = [
        layer for layer in layers_of(float_model) if layer.node.name == "conv"
    ]  # fmt: skip
    done = correct_in_order(float_model, target, shifted, data, inputs, None)
    assert [d.significant for d in done] == [2]  # channel 2 has no shift
    assert done[0].kept and done[0].error_after < done[0].error_before == before
    assert done[0].error_after < 1e-10  # the shift was all of the error
    corrected = ir.Graph(float_model).const_value("b")
    np.testing.assert_allclose(corrected, weight(rng(1), 3) - offset * [1, 1, 0], atol=1e-6)


def layers_of(m: onnx.ModelProto):
    """Every Conv with a bias, as the step sees it when all weights are quantized."""
    cfg = QuantConfig(progress=False, min_channels=0)
    graph = ir.Graph(m)
    annotations, _ = placed(m, PROFILES["tensorrt"], cfg, batches(2), model_inputs(graph))
    return layers(m, annotations)


def two_convs() -> onnx.ModelProto:
    """``x -> conv_a (1x1, 4 -> 3, bias) -> conv_b (1x1, 3 -> 2, bias) -> y``."""
    r = rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a"),
        helper.make_node("Conv", ["a", "wb", "bb"], ["y"], name="conv_b"),
    ]
    inits = [
        init("wa", weight(r, 3, 4, 1, 1)),
        init("ba", weight(r, 3)),
        init("wb", weight(r, 2, 3, 1, 1)),
        init("bb", weight(r, 2)),
    ]
    return model(nodes, [tensor("x", [2, 4, 5, 5])], [tensor("y", [2, 2, 5, 5])], inits)


def test_a_correction_that_makes_the_outputs_worse_is_undone():
    float_model = ir.infer_shapes(two_convs())
    data = batches()
    inputs = model_inputs(ir.Graph(float_model))
    delta = np.array([0.5, -0.5, 0.25], dtype=np.float32)

    def compensated(m: onnx.ModelProto) -> onnx.ModelProto:
        # conv_a's output is shifted, and conv_b's bias undoes it exactly: the outputs are the
        # float ones, so removing conv_a's (real, significant) shift can only make them worse
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
        graph = ir.Graph(copy)
        ba, bb, wb = (graph.const_value(n) for n in ("ba", "bb", "wb"))
        assert ba is not None and bb is not None and wb is not None
        graph.set_initializer("ba", ba + delta)
        graph.set_initializer("bb", bb - wb[:, :, 0, 0] @ delta)
        return copy

    original = ir.Graph(float_model).const_value("ba")
    done = correct_in_order(float_model, layers_of(float_model), compensated, data, inputs, None)
    first = done[0]
    assert first.node == "conv_a" and first.significant == 3
    np.testing.assert_allclose(first.max_shift, 0.5, rtol=1e-4)
    assert not first.kept and first.error_after > first.error_before  # type: ignore[operator]
    np.testing.assert_array_equal(ir.Graph(float_model).const_value("ba"), original)


def test_the_activation_after_a_layer_sets_where_its_shift_is_measured():
    m = ir.infer_shapes(conv_chain())
    graph = ir.Graph(m)
    assert _passed(graph, "c1") == (0.0, None)  # Relu
    assert _passed(graph, "y") is None  # a graph output
    clip = ir.infer_shapes(
        model(
            [
                helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
                helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="relu6"),
            ],
            [tensor("x", [1, 4, 3, 3])],
            [tensor("y", [1, 3, 3, 3])],
            [
                init("w", weight(rng(0), 3, 4, 1, 1)),
                init("b", weight(rng(0), 3)),
                init("lo", np.float32(0.0)),
                init("hi", np.float32(6.0)),
            ],
        )
    )
    assert _passed(ir.Graph(clip), "c") == (0.0, 6.0)


def test_quantize_with_sequential_correction_reports_every_layer_and_passes_check():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=6)
    cfgs = {"progress": False, "min_channels": 0, "fidelity_batches": 2}
    plain = onnxq.quantize(m, data, backend="tensorrt", **cfgs)
    fixed = onnxq.quantize(m, data, backend="tensorrt", sequential_correction=True, **cfgs)
    section = fixed.report.recovery["sequential_correction"]
    assert [layer["node"] for layer in section["layers"]] == ["conv1", "conv2"]
    assert section["corrected"] == sum(layer["kept"] for layer in section["layers"])
    for layer in section["layers"]:
        if layer["kept"]:
            assert layer["error_after"] < layer["error_before"]
    assert check(fixed.model, PROFILES["tensorrt"]) == []
    # never worse than without it on the calibration data (what each kept layer was judged on)
    inputs = model_inputs(ir.Graph(ir.infer_shapes(m)))
    judge = OutputDrift(ir.infer_shapes(m), data, inputs, None, 2**30)
    assert judge(fixed.model) <= judge(plain.model) + 1e-12
    again = onnxq.quantize(m, data, backend="tensorrt", sequential_correction=True, **cfgs)
    assert again.model.SerializeToString() == fixed.model.SerializeToString()


def test_onnxruntime_profile_takes_the_corrected_biases_into_its_int32_bias():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=6)
    out = onnxq.quantize(
        m, data, backend="onnxruntime", sequential_correction=True, progress=False,
        min_channels=0, fidelity_batches=2,
    )  # fmt: skip
    assert "sequential_correction" in out.report.recovery
    assert check(out.model, PROFILES["onnxruntime"]) == []


def test_a_source_read_once_skips_it_with_a_warning():
    m = conv_chain()
    data = image_batches(ir.infer_shapes(m), n=6)
    out = onnxq.quantize(
        m, iter(data), backend="tensorrt", sequential_correction=True, progress=False,
        fidelity_batches=2,
    )  # fmt: skip
    assert "sequential_correction" not in out.report.recovery
    assert any("sequential correction skipped" in w for w in out.report.warnings)


def test_the_cli_flag_sets_the_config_field():
    parser = argparse.ArgumentParser()
    add_recovery_flags(parser, parser)
    assert recovery_options(parser.parse_args(["--sequential-correction"]))["sequential_correction"]
    assert recovery_options(parser.parse_args([]))["sequential_correction"] is None
