"""Cross-layer equalization: the rewrite is exact in float (onnxruntime), evens out the
weight ranges of each pair, and leaves Clip pairs alone with a reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq import ir
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.recover.cle import equalize
from tests.recover.builders import conv_act_conv, conv_chain, image_batches


def run(m: onnx.ModelProto, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, b)[0] for b in batches])


def equalized(m: onnx.ModelProto):
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    graph = ir.Graph(copy)
    modified, decisions = equalize(graph)
    graph.commit()
    return copy, modified, decisions


def assert_same_function(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    batches = image_batches(a, n=3)
    ref, got = run(a, batches), run(b, batches)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize(
    ("activation", "groups"),
    [("Relu", 1), (None, 1), ("LeakyRelu", 1), ("PRelu", 1), ("Relu", 16), ("Relu", 4)],
    ids=["relu", "none", "leaky", "prelu", "depthwise", "grouped"],
)
def test_equalization_is_exact_and_evens_the_ranges(activation, groups):
    m = conv_act_conv(activation, second_groups=groups)
    out, modified, decisions = equalized(m)
    assert modified
    (d,) = decisions
    assert d.equalized and (d.first, d.second) == ("conv1", "conv2")
    assert d.spread_before > 50 and d.spread_after < 1.01
    assert_same_function(m, out)
    w1 = onnx.numpy_helper.to_array(
        next(t for t in out.graph.initializer if t.name == "conv1.weight")
    )
    before = onnx.numpy_helper.to_array(m.graph.initializer[0])
    assert not np.allclose(w1, before)  # the weights did change


def test_depthwise_first_conv_is_equalized_too():
    m = conv_act_conv("Relu", first_groups=8, second_groups=1)
    out, modified, decisions = equalized(m)
    assert modified and decisions[0].equalized
    assert_same_function(m, out)


def test_relu6_pair_is_left_alone_with_a_reason():
    m = conv_act_conv("Clip")
    out, modified, decisions = equalized(m)
    assert not modified
    (d,) = decisions
    assert not d.equalized and "Clip" in d.reason and "per-channel bounds" in d.reason
    assert out.SerializeToString() == m.SerializeToString()


def test_a_chain_of_pairs_settles_and_stays_exact():
    m = conv_chain()
    out, modified, decisions = equalized(m)
    assert modified and [d.equalized for d in decisions] == [True, True]
    assert all(d.spread_after < 1.05 for d in decisions)
    assert_same_function(m, out)


def test_a_shared_tensor_is_not_a_pair():
    m = conv_act_conv("Relu")
    m.graph.output.append(onnx.helper.make_tensor_value_info("act_out", 1, [1, 16, 10, 10]))
    _, modified, decisions = equalized(m)
    assert not modified and decisions == []


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_quantize_with_cle_reports_the_pairs_and_passes_check(backend):
    m = conv_chain()
    result = onnxq.quantize(m, image_batches(m), backend=backend, cle=True, progress=False)
    section = result.report.to_dict()["recovery"]["cle"]
    assert section["equalized"] == 2
    assert [p["first"] for p in section["pairs"]] == ["conv1", "conv2"]
    assert check(result.model, PROFILES[backend]) == []
