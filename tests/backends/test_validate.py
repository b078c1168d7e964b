"""Run-time validation: outputs in onnxruntime and fidelity against the float model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxq import ir
from onnxq.backends.output_metrics import slice_axis_of
from onnxq.backends.runs import padding_masks, run_outputs, validation_session
from onnxq.backends.validate import OutputFidelity, class_axes, fidelity
from onnxq.calibrate.session import make_session
from onnxq.errors import InternalError, UnsupportedModelError
from tests import graphs


def test_run_outputs_per_batch_from_a_model_or_a_session():
    model = graphs.conv_relu()
    batches = graphs.random_batches(model, 2)
    from_model = run_outputs(model, batches, fused=False, what="float")
    from_session = run_outputs(make_session(model), batches, fused=True, what="float")
    assert len(from_model) == 2 and set(from_model[0]) == {"y"}
    for a, b in zip(from_model, from_session, strict=True):
        np.testing.assert_allclose(a["y"], b["y"], rtol=1e-5, atol=1e-6)


def test_run_outputs_failure_names_the_model_and_batch_and_whose_fault_it_is():
    model = graphs.conv_relu()
    batches = [graphs.random_inputs(model), {"x": np.zeros((1, 16, 4, 4), np.float32)}]
    # the user's model failing on data that matches its inputs: the model's error
    with pytest.raises(
        UnsupportedModelError, match="the float model fails in onnxruntime on held batch 1"
    ) as caught:
        run_outputs(model, batches, fused=False, what="float")
    assert caught.value.onnxruntime_failed
    # onnxq's own output failing where the float model ran: a bug in onnxq
    with pytest.raises(
        InternalError, match="the quantized model fails in onnxruntime on held batch 1"
    ) as internal:
        run_outputs(model, batches, fused=False, what="quantized", ours=True)
    assert "this is a bug in onnxq" in str(internal.value)


def test_validation_sessions_run_nodes_in_the_models_priority_order():
    """onnxruntime's default order runs every weight's DequantizeLinear before the first
    MatMul: an unfused model would then hold all its weights in float at once."""
    import onnxruntime as ort

    for fused in (False, True):
        opts = validation_session(graphs.conv_relu(), fused).get_session_options()
        assert opts.execution_order == ort.ExecutionOrder.PRIORITY_BASED
        assert opts.graph_optimization_level == (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if fused
            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )


def test_validation_session_load_failure_names_the_model():
    model = graphs.conv_relu()
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedModelError, match="cannot load the float model"):
        validation_session(model, fused=False, what="float")
    with pytest.raises(InternalError, match="cannot load the quantized model"):
        validation_session(model, fused=False, ours=True)


def test_fidelity_of_identical_outputs_is_perfect():
    ref = [{"y": np.array([1.0, -2.0, 3.0], np.float32)}]
    (fid,) = fidelity(ref, ref)
    assert fid == OutputFidelity("y", 1.0, 0.0, 3.0)


def test_fidelity_measures_cosine_and_max_error_over_all_batches():
    ref = [{"y": np.array([1.0, 0.0])}, {"y": np.array([0.0, 1.0])}]
    got = [{"y": np.array([1.0, 0.0])}, {"y": np.array([0.0, -1.0])}]
    (fid,) = fidelity(ref, got)
    assert fid.cosine == 0.0 and fid.max_abs_error == 2.0 and fid.float_max_abs == 1.0


def test_fidelity_of_values_whose_squares_overflow_is_a_number():
    # float64 outputs near 1e200 (the onnx package's own broadcast-Add test data): the squares
    # overflow to inf and the cosine was NaN
    big = np.array([[[1e200, -2e200], [3e200, 4e200]] * 8], np.float64)  # [1, 16, 2]
    (fid,) = fidelity([{"y": big}], [{"y": big}])
    assert fid.cosine == 1.0 and fid.max_abs_error == 0.0
    assert fid.worst_slice_cosine == 1.0
    (fid,) = fidelity([{"y": big}], [{"y": -big}])
    assert fid.cosine == -1.0


def test_fidelity_of_integer_outputs_is_the_share_of_equal_values():
    # one label of 8 changed: 7/8 agree (per batch it would read as half the batches differing)
    ref = [{"ids": np.array([1, 2, 3, 4])}, {"ids": np.array([3, 4, 5, 6])}]
    got = [{"ids": np.array([1, 2, 3, 4])}, {"ids": np.array([3, 5, 5, 6])}]
    assert fidelity(ref, got) == [OutputFidelity("ids", 0.875, 0.0, 0.0, "agreement")]
    # a batch whose shapes differ counts as differing in every value
    got[1] = {"ids": np.array([3, 4, 5])}
    assert fidelity(ref, got)[0].cosine == 0.5


def test_fidelity_of_label_maps_compares_their_values_and_skips_other_outputs():
    # scikit-learn's ZipMap: one {label: probability} map per sample
    ref = [{"p": [{0: 0.9, 1: 0.1}, {0: 0.2, 1: 0.8}], "s": [np.zeros(2, np.float32)]}]
    got = [{"p": [{0: 0.8, 1: 0.2}, {0: 0.2, 1: 0.8}], "s": [np.ones(2, np.float32)]}]
    maps, other = fidelity(ref, got)
    want = (
        np.array([0.9, 0.1, 0.2, 0.8])
        @ np.array([0.8, 0.2, 0.2, 0.8])
        / (np.linalg.norm([0.9, 0.1, 0.2, 0.8]) * np.linalg.norm([0.8, 0.2, 0.2, 0.8]))
    )
    assert maps.compared == "cosine" and maps.cosine == pytest.approx(want, abs=1e-6)
    assert maps.max_abs_error == pytest.approx(0.1) and maps.float_max_abs == 0.9
    assert other.compared == "not compared: a list output, not a numeric tensor"


def test_fidelity_leaves_nan_and_inf_out_and_counts_where_the_models_disagree_on_them():
    ref = [{"y": np.array([1.0, np.nan, np.inf, 2.0, -np.inf])}]
    same = [{"y": np.array([1.0, np.nan, np.inf, 2.5, -np.inf])}]
    (fid,) = fidelity(ref, same)
    want = (1.0 + 5.0) / (np.sqrt(5.0) * np.sqrt(7.25))
    assert fid.cosine == pytest.approx(want, abs=1e-6) and fid.max_abs_error == 0.5
    assert (fid.float_max_abs, fid.nonfinite, fid.nonfinite_mismatch) == (2.0, 3, 0)
    # finite where the float model is not, NaN where it is finite, Inf against -Inf
    other = [{"y": np.array([np.nan, 3.0, np.inf, 2.0, np.inf])}]
    (fid,) = fidelity(ref, other)
    assert (fid.nonfinite, fid.nonfinite_mismatch) == (3, 3) and fid.cosine == 1.0
    assert np.isfinite([fid.cosine, fid.max_abs_error, fid.float_max_abs]).all()


def test_top1_agreement_along_the_class_axis_of_softmax_outputs():
    ref = [{"p": np.array([[0.1, 0.9], [0.8, 0.2]]), "box": np.array([[1.0, 2.0], [3.0, 4.0]])}]
    got = [{"p": np.array([[0.6, 0.4], [0.7, 0.3]]), "box": np.array([[2.0, 1.0], [3.0, 4.0]])}]
    p, box = fidelity(ref, got, {"p": 1})
    assert p.top1_agreement == 0.5 and box.top1_agreement is None
    # along the other axis: column 0 peaks in row 1 and column 1 in row 0, in both models
    assert fidelity(ref, got, {"p": 0})[0].top1_agreement == 1.0
    assert fidelity(ref, got)[0].top1_agreement is None


@pytest.mark.parametrize(
    "shape, axis",
    [
        ((1, 3549, 6), 2),  # YOLOX: anchors x (4 box + objectness + classes)
        ((1, 22, 2100), 1),  # YOLOv8: (4 box + classes) x anchors
        ((2, 16, 32, 32), 1),  # a segmentation map's channels
        ((1, 16, 16, 16), 1),  # a tie: the first
        ((1, 2, 1, 1), None),  # too few values per slice
        ((1, 1, 736, 736), None),  # one channel, large spatial axes
        ((8, 10), None),  # rank 2: a classifier
        ((1, 300, 200), None),  # no axis of 2..128
    ],
)
def test_the_slice_axis_is_the_smallest_small_axis_after_the_batch(shape, axis):
    assert slice_axis_of(shape) == axis


def test_a_lost_column_shows_in_the_worst_slice_while_the_whole_cosine_stays_high():
    r = graphs.rng(5)
    ref, got = [], []
    for _ in range(3):
        boxes = r.uniform(0, 300, (1, 200, 4))
        scores = r.uniform(0, 1, (1, 200, 2))
        zero = np.zeros((1, 200, 1))
        ref.append({"det": np.concatenate([boxes, scores, zero], axis=2).astype(np.float32)})
        lost = r.uniform(0, 1, (1, 200, 2))  # the scores replaced by noise
        got.append({"det": np.concatenate([boxes + 1, lost, zero], axis=2).astype(np.float32)})
    (fid,) = fidelity(ref, got)
    assert fid.cosine > 0.99  # the boxes carry the whole
    assert (fid.slice_axis, fid.slices) == (2, 7) and fid.worst_slice in (4, 5)
    assert fid.worst_slice_cosine < 0.9
    assert 250 < fid.slice_peak_ratio < 350  # box peaks (~300) over score peaks (~1)
    # a Softmax output is measured by its top-1 agreement instead
    (soft,) = fidelity(ref, got, {"det": -1})
    assert soft.top1_agreement is not None and soft.slice_axis is None
    # an all-zero slice in both models counts as equal, not as 0/0
    (same,) = fidelity(ref, ref)
    assert same.worst_slice_cosine == pytest.approx(1.0) and same.cosine == pytest.approx(1.0)
    # rank 2: no slices
    (flat,) = fidelity([{"p": np.ones((4, 3))}], [{"p": np.ones((4, 3))}])
    assert flat.slice_axis is None and flat.worst_slice_cosine is None


def test_class_axes_are_the_softmax_outputs_and_their_axis():
    model = graphs.conv_relu()
    model.graph.node.append(onnx.helper.make_node("Softmax", ["y"], ["p"], name="sm", axis=1))
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 16, 8, 8])
    )
    assert class_axes(model) == {"p": 1}  # the Relu output 'y' has no class axis


def test_class_axis_of_an_opset_11_softmax_upgraded_to_13():
    # onnx's version converter writes Softmax-11(axis=2) on a rank-3 tensor as
    # Reshape(Softmax(Flatten(x, axis=2)), Shape(x)); the class axis is still the last one
    # (it does so when x's rank is unknown, as in PP-OCRv4's recognizer)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)
    p = onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, ["n", "t", 7])
    old = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Softmax", ["x"], ["p"], axis=2)], "g", [x], [p]
        ),
        opset_imports=[onnx.helper.make_opsetid("", 11)],
    )
    new = ir.upgrade_opset(old, 13)
    assert [n.op_type for n in new.graph.node] == ["Shape", "Flatten", "Softmax", "Reshape"]
    assert class_axes(new) == {"p": -1}
    # axis 1 of that rank-3 tensor flattened the last two axes together: no class axis
    old.graph.node[0].attribute[0].i = 1
    assert class_axes(ir.upgrade_opset(old, 13)) == {}


def test_fidelity_of_all_zero_outputs():
    zeros = [{"y": np.zeros(3)}]
    assert fidelity(zeros, zeros)[0].cosine == 1.0
    assert fidelity(zeros, [{"y": np.ones(3)}])[0].cosine == 0.0
    assert fidelity([], []) == []


def test_padded_positions_are_left_out_of_the_cosine():
    r = np.random.default_rng(4)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=np.int64)
    ref = r.standard_normal((2, 5, 8)).astype(np.float32)
    got = ref.copy()
    got[0, 3:] = -ref[0, 3:] * 50  # garbage where the mask says padding
    masks = padding_masks([{"input_ids": np.ones((2, 5), np.int64), "attention_mask": mask}])
    assert masks[0] is not None and masks[0].sum() == 8
    (out,) = fidelity([{"h": ref}], [{"h": got}], None, masks)
    assert out.cosine == pytest.approx(1.0) and out.padding_left_out == 2
    (whole,) = fidelity([{"h": ref}], [{"h": got}])  # no mask: the garbage counts
    assert whole.cosine < 0.5 and whole.padding_left_out == 0
    # an output whose leading axes are not the mask's ([batch, hidden]) is compared whole
    (pooled,) = fidelity([{"p": ref[:, 0]}], [{"p": got[:, 0]}], None, masks)
    assert pooled.padding_left_out == 0
    # a class axis after the sequence axis still gives a top-1 agreement, on real tokens only
    (logits,) = fidelity([{"l": ref}], [{"l": got}], {"l": 2}, masks)
    assert logits.top1_agreement == pytest.approx(1.0)
    assert padding_masks([{"x": np.ones((2, 5), np.float32)}]) == [None]


def test_a_few_large_samples_cannot_hide_the_others_in_the_per_sample_cosine():
    # timm's convmixer (random weights): logits norms from 1.8 to 30000 across images; one
    # cosine over all of them said 0.962 while the samples averaged 0.44
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 100))
    ref[0] *= 1000.0  # one loud sample, kept exactly
    got = ref.copy()
    got[1:] = rng.standard_normal((7, 100))  # the seven quiet ones lost
    (fid,) = fidelity([{"y": ref[:4]}, {"y": ref[4:]}], [{"y": got[:4]}, {"y": got[4:]}])
    assert fid.cosine > 0.999
    assert fid.sample_cosine_mean is not None and fid.sample_cosine_mean < 0.3
    assert fid.worst_sample_cosine is not None and fid.worst_sample_cosine < 0.3
    (agree,) = fidelity([{"y": ref}], [{"y": ref}])
    assert agree.sample_cosine_mean == agree.worst_sample_cosine == 1.0
    (scalar,) = fidelity([{"y": ref[:, :1]}], [{"y": got[:, :1]}])  # one value per sample
    assert scalar.sample_cosine_mean is None


def test_fidelity_leaves_the_outputs_it_compares_unchanged(monkeypatch: pytest.MonkeyPatch):
    # the float64 copies are scaled in place and maxima taken in slices: the caller's arrays
    # (float64 ones included) stay as they were, and the figures are those of the whole
    from onnxq.backends import output_metrics

    monkeypatch.setattr(output_metrics, "_ABS_CHUNK", 7)
    rng = np.random.default_rng(1)
    ref = [{"y": rng.standard_normal((1, 5, 9))} for _ in range(3)]
    got = [{"y": r["y"] + rng.standard_normal((1, 5, 9)) * 0.1} for r in ref]
    kept = [(r["y"].copy(), g["y"].copy()) for r, g in zip(ref, got, strict=True)]
    (fid,) = fidelity(ref, got)
    for (r, g), a, b in zip(kept, ref, got, strict=True):
        assert np.array_equal(r, a["y"]) and np.array_equal(g, b["y"])
    a = np.concatenate([r.ravel() for r, _ in kept])
    b = np.concatenate([g.ravel() for _, g in kept])
    assert fid.max_abs_error == float(np.max(np.abs(a - b)))
    assert fid.float_max_abs == float(np.max(np.abs(a)))
    assert fid.cosine == round(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), 6)
    # three batches of one sample each: three per-sample cosines
    cosines = [
        float(r.ravel() @ g.ravel() / np.linalg.norm(r) / np.linalg.norm(g)) for r, g in kept
    ]
    assert fid.worst_sample_cosine == round(min(cosines), 6)
