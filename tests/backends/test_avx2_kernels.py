"""onnxruntime's int8 kernels on an x86-64 CPU without VNNI, for real: under
``qemu-x86_64 -cpu Haswell`` onnxruntime picks its AVX2 kernels, which add pairs of u8 x s8
products in saturating int16 sums.  The facts the x86-avx2 class rests on are checked there:
full-range int8 weights saturate; 7-bit ones, uint8 ones (its u8 x u8 kernels) and depthwise
convs do not; an x86-avx2 output (uint8 weights, or 7-bit with ``reduce_range``) computes there
what it computes here, and a TensorRT output run fused there can be far off.

Needs ``qemu-user`` (``apt-get install qemu-user``) on an x86-64 machine; CI installs it and
sets ``ONNXQ_REQUIRE_QEMU=1`` so that a missing emulator fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import ir
from onnxq.backends import default_session
from onnxq.backends.runs import run_outputs
from onnxq.backends.validate import fidelity
from onnxq.report.fidelity import default_session_warnings
from tests import graphs
from tests.place.rules.test_cost import SEPARABLE, net

QEMU = shutil.which("qemu-x86_64")
X86 = platform.machine().lower() in ("x86_64", "amd64")
PROBE = Path(__file__).with_name("avx2_probe.py")
REPO = Path(__file__).resolve().parents[2]

if not (QEMU and X86) and os.environ.get("ONNXQ_REQUIRE_QEMU") == "1":
    raise RuntimeError("ONNXQ_REQUIRE_QEMU=1 but qemu-x86_64 is missing or this is not x86-64")
pytestmark = pytest.mark.skipif(
    not (QEMU and X86),
    reason="needs qemu-x86_64 (apt-get install qemu-user) on x86-64: onnxruntime's AVX2 "
    "kernels are not checked",
)


def saturating_tensorrt_net() -> onnx.ModelProto:
    """Conv -> Conv, the first with equal positive weights: every pair of its int8 weights is
    127 + 127, so a positive int8 input (run shifted to uint8 above 128) overflows an int16
    pair sum.  The second conv's input Q follows the first directly (no ReLU, which a symmetric
    int8 Q cannot absorb), so onnxruntime fuses the first into a QLinearConv."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["y"], name="c2", pads=[1, 1, 1, 1]),
    ]
    inits = [
        graphs.init("w1", np.full((16, 16, 3, 3), 0.05, np.float32)),
        graphs.init("w2", graphs.weight(graphs.rng(1), 16, 16, 3, 3)),
    ]
    shape = [1, 16, 8, 8]
    return graphs.model(nodes, [graphs.tensor("x", shape)], [graphs.tensor("y", shape)], inits)


def _batches(model: onnx.ModelProto, scale: float) -> list[dict[str, np.ndarray]]:
    return [{k: v * scale for k, v in b.items()} for b in graphs.random_batches(model, 6)]


@pytest.fixture(scope="module")
def on_avx2(tmp_path_factory) -> tuple[dict, Path, dict]:
    """Quantize here, run the probe under qemu; returns (its JSON, its folder, the cases)."""
    folder = tmp_path_factory.mktemp("avx2")
    separable = ir.infer_shapes(net(SEPARABLE))
    trt_net = saturating_tensorrt_net()
    cases = {}
    for name, model, options, stress in [
        ("sep_avx2", separable, {"backend": "onnxruntime", "target_cpu": "x86-avx2"}, 3.0),
        (
            "sep_avx2_7bit",
            separable,
            {"backend": "onnxruntime", "target_cpu": "x86-avx2", "reduce_range": True},
            3.0,
        ),
        ("sep_vnni", separable, {"backend": "onnxruntime", "target_cpu": "x86-vnni"}, 3.0),
        # high_precision fp32: onnxruntime fuses an FP32 Q/DQ graph into its int8 kernels; it
        # leaves the default FP16 one unfused (fused and unfused then agree there)
        ("trt", trt_net, {"high_precision": "fp32"}, 1.0),
    ]:
        calibration = graphs.random_batches(model, 6)
        result = onnxq.quantize(model, calibration, progress=False, **options)
        result.save(folder / f"{name}.onnx")
        batches = _batches(model, stress)  # beyond the calibrated range: u8 codes near 255
        np.savez(
            folder / f"{name}.feed.npz",
            **{f"{k}:{i}": v for i, b in enumerate(batches) for k, v in b.items()},
        )
        cases[name] = (model, result.model, batches)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ONNXQ_TARGET_CPU", None)
    assert QEMU is not None
    done = subprocess.run(
        [QEMU, "-cpu", "Haswell", sys.executable, str(PROBE), str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), folder, cases


def _fused_there(folder: Path, name: str, batches: list) -> list[dict[str, np.ndarray]]:
    with np.load(folder / f"{name}.fused.npz") as z:
        return [{"y": z[f"y:{i}"]} for i in range(len(batches))]


def test_an_avx2_cpu_is_detected_as_x86_avx2(on_avx2):
    probe, _, _ = on_avx2
    assert probe["detected"] == "x86-avx2"


def test_full_range_int8_weights_overflow_there_and_7_bit_uint8_or_depthwise_ones_do_not(on_avx2):
    probe, _, _ = on_avx2
    exact, fused_ops = probe["exact"], probe["fused_ops"]
    kernels = {
        "conv1x1": "QLinearConv",
        "conv3x3": "QLinearConv",
        "gemm": "QGemm",
        "matmul": "QLinearMatMul",
        "matmul_float": "MatMulIntegerToFloat",
    }
    for kind, kernel in kernels.items():
        assert not exact[f"{kind} 127"], kind  # u8 255 x s8 127, twice: past int16
        assert exact[f"{kind} 63"], kind
        assert exact[f"{kind} u8 127"], kind  # u8 x u8: int32 sums
        # the uint8 weights fuse into the same integer kernel as the int8 ones
        assert kernel in fused_ops[f"{kind} u8 127"], fused_ops[f"{kind} u8 127"]
        assert fused_ops[f"{kind} u8 127"] == fused_ops[f"{kind} 127"], kind
    assert all(exact[f"depthwise3x3 {w}"] for w in ("127", "63", "u8 127"))  # int32 sums


def test_an_x86_avx2_output_computes_there_what_it_computes_here(on_avx2):
    _, folder, cases = on_avx2
    differences = {}
    for name in ("sep_avx2", "sep_avx2_7bit", "sep_vnni"):
        _, quantized, batches = cases[name]
        here = run_outputs(quantized, batches, True, "quantized")
        there = _fused_there(folder, name, batches)
        differences[name] = max(
            float(np.max(np.abs(a["y"] - b["y"]))) for a, b in zip(here, there, strict=True)
        )
    assert differences["sep_avx2"] < 1e-4 and differences["sep_avx2_7bit"] < 1e-4
    # int8 weights of the full range (what a VNNI CPU gets) come out different there
    assert differences["sep_vnni"] > 100 * max(differences["sep_avx2"], 1e-6)


def test_a_tensorrt_output_run_fused_there_differs_beyond_noise(on_avx2):
    _, folder, cases = on_avx2
    model, quantized, batches = cases["trt"]
    reference = run_outputs(model, batches, False, "float")
    (unfused,) = fidelity(reference, run_outputs(quantized, batches, False, "quantized"))
    (fused,) = fidelity(reference, _fused_there(folder, "trt", batches))
    compared = default_session._compare(unfused, fused)
    assert unfused.cosine > 0.99 and compared.beyond_noise, (unfused.cosine, fused.cosine)
    view = default_session.DefaultSessionView("x86-avx2", (compared,))
    (message,) = default_session_warnings(view)
    assert "int16 sums" in message and "--backend onnxruntime" in message
