"""How the sensitivity ranking's time grows with the number of layers.

Builds chains of L Conv 3x3 -> Relu layers (16 channels, 16x16 maps), calibrates each once and
ranks its layers (``onnxq.mixed.sensitivity.rank_layers``: L + 1 trials, each one placement, one
materialize, one onnxruntime session and the held-out batches through the whole model).
Prints, per L: the calibration time (once), the ranking time, the time per trial, and the
ranking time over the calibration time.  For a fixed model the number of trials grows
linearly with L; here the model grows with L too, so each trial also costs more.

    python scripts/bench_sensitivity.py [--layers 4 8 16 32] [--heldout 8]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxq import ir
from onnxq.backends.runs import run_outputs
from onnxq.backends.target import profile_for
from onnxq.calibrate.measure import Calibration
from onnxq.config import QuantConfig
from onnxq.data.inputs import model_inputs
from onnxq.mixed.sensitivity import Trials, candidates, rank_layers
from onnxq.numerics.accuracy_target import parse_target
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import place
from onnxq.prepare.stage import prepare

CHANNELS, SIZE = 16, 16


def chain(layers: int) -> onnx.ModelProto:
    """x -> (Conv 3x3 -> Relu) x ``layers``."""
    r = np.random.default_rng(0)
    nodes, inits, src = [], [], "x"
    for i in range(layers):
        w = (r.standard_normal((CHANNELS, CHANNELS, 3, 3)) * 0.15).astype(np.float32)
        b = (r.standard_normal(CHANNELS) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [
            helper.make_node(
                "Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1] * 4
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        src = f"r{i}"
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(src, onnx.TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def measure(layers: int, heldout: int, calibration: int) -> tuple[float, float, int]:
    """(calibration seconds, ranking seconds, trials) for a chain of ``layers``."""
    r = np.random.default_rng(1)
    batches = [
        {"x": r.standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32)}
        for _ in range(heldout + calibration)
    ]
    config = QuantConfig(progress=False)
    profile, _ = profile_for(config.target)
    prepared = prepare(chain(layers), profile)
    graph = ir.Graph(prepared.model)
    facts = GraphFacts.of(graph, profile)
    start = time.perf_counter()
    calib = Calibration(
        prepared.model, batches[heldout:], model_inputs(graph), config.calibration, facts
    )
    first = place(facts, profile, config.placement, calib)
    calibrated = time.perf_counter() - start
    start = time.perf_counter()
    held = batches[:heldout]
    reference = run_outputs(prepared.model, held, profile.fused_validation, "float")
    trials = Trials(
        prepared.model, facts, profile, config, calib, held, reference, parse_target("cosine=1")
    )
    rank_layers(trials, candidates(first.annotations))
    return calibrated, time.perf_counter() - start, trials.count


def main() -> None:
    import onnxruntime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--heldout", type=int, default=8)
    parser.add_argument("--calibration", type=int, default=32)
    args = parser.parse_args()
    print(f"onnxruntime {onnxruntime.__version__}, {platform.processor() or platform.machine()}")
    print(
        f"{'layers':>6} {'trials':>6} {'calibrate s':>11} {'rank s':>8} {'s/trial':>8} "
        f"{'rank/calib':>10}"
    )
    for layers in args.layers:
        calibrated, ranked, trials = measure(layers, args.heldout, args.calibration)
        print(
            f"{layers:>6} {trials:>6} {calibrated:>11.2f} {ranked:>8.2f} "
            f"{ranked / trials:>8.3f} {ranked / calibrated:>10.1f}"
        )


if __name__ == "__main__":
    main()
