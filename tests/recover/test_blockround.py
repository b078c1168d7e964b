"""Block reconstruction (``adaround_mode: block``): a block's learned rounding is kept only
where its output error and then the model's drop, checked again with onnxruntime on the
written model; numpy and torch agree; the same inputs give the same bytes; the flag."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxq
from onnxq.backends.check import check
from onnxq.backends.profile import PROFILES
from onnxq.cli import main
from tests.recover.builders import inverted_residual
from tests.recover.test_adaround import dequantized_weight, smooth_batches
from tests.recover.test_seqround import exposed


def block_run(m, batches, steps=150, **options):
    return onnxq.quantize(
        m, batches, adaround=True, adaround_mode="block", adaround_steps=steps,
        progress=False, **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs():
    m = inverted_residual()
    batches = smooth_batches(m, n=24)  # even batches fit, odd ones judge
    return m, batches, onnxq.quantize(m, batches, progress=False), block_run(m, batches)


def test_every_block_is_reported_and_the_model_error_never_rises(runs):
    _, _, _, learned = runs
    section = learned.report.to_dict()["recovery"]["adaround"]
    assert section["mode"] == "block"
    blocks = section["blocks"]
    assert [b["layers"] for b in blocks] == [
        ["b1.expand", "b1.depthwise", "b1.project"],
        ["b2.expand", "b2.depthwise", "b2.project"],
        ["head"],
    ]
    errors = []
    for b in blocks:
        assert b["images"] == 12 and b["steps"] == 150
        if b["model_error_learned"] is None:  # lost on its own judged images already
            assert b["kept"] == "nearest" and b["mse_learned"] >= b["mse_nearest"]
            continue
        assert b["mse_learned"] < b["mse_nearest"]
        better = b["model_error_learned"] < b["model_error_nearest"]
        assert b["kept"] == ("learned" if better else "nearest")
        errors.append(b["model_error_learned"] if better else b["model_error_nearest"])
    assert any(b["kept"] == "learned" for b in blocks)
    assert errors == sorted(errors, reverse=True)
    assert section["learned"] == sum(len(b["layers"]) for b in blocks if b["kept"] == "learned")
    assert check(learned.model, PROFILES["tensorrt"]) == []


def test_the_written_model_has_the_learned_integers_and_a_lower_error(runs):
    m, batches, nearest, learned = runs
    blocks = learned.report.to_dict()["recovery"]["adaround"]["blocks"]
    for b in blocks:
        differs = [
            np.any(dequantized_weight(learned.model, n) != dequantized_weight(nearest.model, n))
            for n in b["layers"]
        ]
        assert any(differs) == (b["kept"] == "learned"), b["layers"]
    odd = batches[1::2]
    want = [y for (y,) in exposed(m, ["y"], odd)]

    def error(model: onnx.ModelProto) -> float:
        got = [y for (y,) in exposed(model, ["y"], odd)]
        return sum(float(np.square(g - w).sum()) for g, w in zip(got, want, strict=True))

    assert error(learned.model) < error(nearest.model)


def test_torch_gives_the_same_model_within_tolerance():
    pytest.importorskip("torch")
    m = inverted_residual()
    batches = smooth_batches(m, n=8)
    models = [block_run(m, batches, 100, adaround_engine=e).model for e in ("numpy", "torch")]
    for node in ("b1.expand", "b1.depthwise", "b1.project", "b2.project", "head"):
        a, b = (dequantized_weight(model, node) for model in models)
        assert np.mean(a != b) < 0.02, node


def test_the_same_inputs_give_the_same_bytes():
    m = inverted_residual()
    batches = smooth_batches(m, n=6)
    first, second = (block_run(m, batches, 40).model.SerializeToString() for _ in range(2))
    assert first == second


def test_the_flag_turns_block_reconstruction_on(tmp_path):
    m = inverted_residual()
    model = tmp_path / "model.onnx"
    onnx.save(m, model)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, batch in enumerate(smooth_batches(m, n=4)):
        np.savez(calib / f"{i:04d}.npz", **batch)
    report = tmp_path / "r.json"
    args = ["quantize", str(model), "-o", str(tmp_path / "out.onnx"), "--calib", str(calib)]
    args += [
        "--report",
        str(report),
        "-q",
        "--adaround-mode",
        "block",
        "--set",
        "recovery.adaround_steps=20",
    ]
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert (data["config"]["adaround"], data["config"]["adaround_mode"]) == (True, "block")
    assert len(data["recovery"]["adaround"]["blocks"]) == 3


def test_the_summary_line_counts_the_blocks(runs):
    from onnxq.recover.stages import summary

    sections = runs[3].report.to_dict()["recovery"]
    kept = sum(b["kept"] == "learned" for b in sections["adaround"]["blocks"])
    assert f"block reconstruction learned {kept} of 3 blocks" in summary(sections)


def test_a_block_the_program_cannot_hold_is_reported_as_skipped():
    from onnxq.recover.blocks import BLOCK_OPS

    m = inverted_residual()
    # a constant operand of an Add inside a segment of block ops: the block is skipped
    add = onnx.helper.make_node("Add", ["b2.out", "shift"], ["shifted"], name="shift_add")
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(0.5), "shift"))
    sig = next(n for n in m.graph.node if n.op_type == "Sigmoid")
    sig.input[0] = "shifted"
    index = list(m.graph.node).index(sig)
    m.graph.node.insert(index, add)
    assert "Add" in BLOCK_OPS
    blocks = block_run(m, smooth_batches(m, n=4), 10).report.to_dict()["recovery"]["adaround"]
    skipped = [b for b in blocks["blocks"] if b["kept"].startswith("skipped")]
    assert skipped and "reads a constant" in skipped[0]["kept"]
