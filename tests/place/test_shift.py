"""Which activations ``shift_activations`` shifts: non-negative ones whose every quantized
reader is a Conv or Gemm that can add the shift back through its bias, a padded reader only
as the one reader; nothing for a backend whose activations have a zero point."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq.errors import ConfigError
from tests.graphs import init, model, rng, tensor, weight
from tests.recover.builders import conv_chain, image_batches

COMMON = {"progress": False, "min_channels": 0, "weak_channel_fraction": 1.0}


def relu_into(readers: list[tuple[str, dict]], floor: float | None = None) -> onnx.ModelProto:
    """``x -> conv0 -> Relu (or Clip(floor, 6)) -> each reader`` (op, attrs); every reader's
    output is a graph output."""
    r = rng(0)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0")]
    inits = [init("w0", weight(r, 16, 16, 1, 1)), init("b0", weight(r, 16))]
    if floor is None:
        nodes.append(helper.make_node("Relu", ["c0"], ["h"], name="act"))
    else:
        inits += [init("lo", np.float32(floor)), init("hi", np.float32(6.0))]
        nodes.append(helper.make_node("Clip", ["c0", "lo", "hi"], ["h"], name="act"))
    outputs = []
    for i, (op, attrs) in enumerate(readers):
        if op == "Add":
            nodes.append(helper.make_node("Add", ["h", "c0"], [f"y{i}"], name=f"read{i}"))
        else:
            kernel = attrs.pop("kernel", 1)
            inits.append(init(f"w{i + 1}", weight(r, 16, 16, kernel, kernel)))
            nodes.append(
                helper.make_node("Conv", ["h", f"w{i + 1}"], [f"y{i}"], name=f"read{i}", **attrs)
            )
        outputs.append(tensor(f"y{i}", [1, 16, None, None]))
    return model(nodes, [tensor("x", [1, 16, 8, 8])], outputs, inits)


def shifted(m: onnx.ModelProto, backend: str = "tensorrt") -> list[str]:
    """The tensors the quantized model shifts (what its Sub nodes read)."""
    out = onnxq.quantize(m, image_batches(m), backend=backend, shift_activations=True, **COMMON)
    return [n.input[0] for n in out.model.graph.node if n.op_type == "Sub"]


@pytest.mark.parametrize(
    ("readers", "floor", "expected"),
    [
        ([("Conv", {}), ("Conv", {})], None, ["h"]),  # two 1x1 convs: both add it back
        ([("Conv", {"kernel": 3, "pads": [1, 1, 1, 1]})], None, ["h"]),  # one padded reader
        ([("Conv", {"kernel": 3, "pads": [1, 1, 1, 1]})] * 2, None, []),  # two: one Pad each
        ([("Conv", {"kernel": 3, "auto_pad": "SAME_UPPER"})], None, []),  # implicit pads
        ([("Conv", {})], 0.0, ["h"]),  # ReLU6
        ([("Conv", {})], -1.0, []),  # a Clip that lets negative values through
    ],
)
def test_what_qualifies(readers, floor, expected):
    assert shifted(relu_into([(op, dict(a)) for op, a in readers], floor)) == expected


def test_a_float_reader_keeps_reading_the_unshifted_tensor():
    m = relu_into([("Conv", {}), ("Add", {})])  # the Add stays float under tensorrt
    out = onnxq.quantize(m, image_batches(m), backend="tensorrt", shift_activations=True, **COMMON)
    nodes = {n.name: n for n in out.model.graph.node}
    assert [n.input[0] for n in nodes.values() if n.op_type == "Sub"] == ["h"]
    assert nodes["read1"].input[0] == "h"


def test_a_gemm_that_transposes_its_input_is_left_alone():
    r = rng(0)
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Gemm", ["h", "w", "b"], ["y"], name="fc", transA=1),
    ]
    inits = [init("w", weight(r, 24, 16)), init("b", weight(r, 16))]
    m = model(nodes, [tensor("x", [24, 4])], [tensor("y", [4, 16])], inits)
    assert shifted(m) == []


def test_onnxruntime_activations_have_a_zero_point_and_the_note_says_it_does_nothing():
    m = conv_chain()
    out = onnxq.quantize(
        m, image_batches(m), backend="onnxruntime", shift_activations=True, **COMMON
    )
    assert not [n for n in out.model.graph.node if n.op_type == "Sub"]
    notes = out.report.to_dict()["notes"]
    assert any("shift_activations does nothing for backend onnxruntime" in n for n in notes)


@pytest.mark.parametrize("mode", ["sequential", "block"])
def test_adaround_modes_that_learn_on_the_quantized_input_are_refused(mode):
    m = conv_chain()
    with pytest.raises(ConfigError, match="adaround_mode float"):
        onnxq.quantize(
            m,
            image_batches(m),
            backend="tensorrt",
            shift_activations=True,
            adaround=True,
            adaround_mode=mode,
            **COMMON,
        )


@pytest.mark.parametrize(
    ("readers", "why"),
    [
        ([("Conv", {"kernel": 3, "pads": [1, 1, 1, 1]})] * 2, "read by several quantized layers"),
        ([("Conv", {"kernel": 3, "auto_pad": "SAME_UPPER"})], "read by a Conv with auto_pad"),
    ],
)
def test_the_note_says_why_a_relu_output_was_not_shifted(readers, why):
    m = relu_into([(op, dict(a)) for op, a in readers])
    out = onnxq.quantize(m, image_batches(m), backend="tensorrt", shift_activations=True, **COMMON)
    (note,) = [n for n in out.report.to_dict()["notes"] if n.startswith("shift_activations")]
    assert note.startswith("shift_activations: 0 non-negative activations")
    assert f"on the whole grid; not shifted: 1 {why}" in note
