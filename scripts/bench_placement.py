"""Placement at scale: graph facts, one rule-engine pass and the placement loop on a generated
10,000-node graph.

The graph is a long chain of residual blocks (Conv -> Relu -> Conv -> Add), with a HardSwish
every 5th block, a Clip every 7th and a Concat (then a 1x1 Conv) every 9th.  The loop runs with
synthetic statistics (no onnxruntime): what is timed is placement itself.  For each backend
the script prints the median of ``--repeat`` runs of

* facts: ``GraphFacts.of`` (the walks over the graph, once per run);
* annotate: one pass of the rule engine (what ``onnxq explain`` does after the facts);
* place: the whole stage as ``onnxq quantize`` runs it: facts, then the loop (rule engine,
  measure, exclusions) until it settles;

and checks the target: the placement stage (``place``, which runs the facts and the rule
engine) under 2 s.  Usage::

    python scripts/bench_placement.py [--nodes 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq import ir
from onnxq.backends.profile import PROFILES
from onnxq.calibrate.engine import CalibrationResult
from onnxq.config import QuantConfig
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.engine import annotate
from onnxq.place.facts import GraphFacts
from onnxq.place.loop import place

TARGET_S = 2.0


def chain_model(target_nodes: int, channels: int = 16, size: int = 8) -> onnx.ModelProto:
    """A chain of residual blocks with HardSwish, Clip and Concat, of about ``target_nodes``."""
    r = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv(src: str, cin: int, kernel: int = 3) -> str:
        k = len(inits)
        weight = (r.standard_normal((channels, cin, kernel, kernel)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{k}"))
        inits.append(numpy_helper.from_array(np.zeros(channels, np.float32), f"b{k}"))
        out = f"conv{k}"
        pads = [kernel // 2] * 4
        nodes.append(helper.make_node("Conv", [src, f"w{k}", f"b{k}"], [out], name=out, pads=pads))
        return out

    def op(op_type: str, inputs: list[str], name: str, **attrs: int) -> str:
        nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    x, block = "input", 0
    while len(nodes) < target_nodes:
        block += 1
        a = op("Relu", [conv(x, channels)], f"relu{block}")
        y = op("Add", [conv(a, channels), x], f"add{block}")
        if block % 5 == 0:
            y = op("HardSwish", [y], f"hardswish{block}")
        if block % 7 == 0:
            y = op("Clip", [y, "low", "high"], f"clip{block}")
        if block % 9 == 0:
            y = conv(op("Concat", [y, x], f"concat{block}", axis=1), 2 * channels, kernel=1)
        x = y
    inits += [
        numpy_helper.from_array(np.array(0.0, np.float32), "low"),
        numpy_helper.from_array(np.array(6.0, np.float32), "high"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ir.infer_shapes(model)


def synthetic_measure() -> Callable[[Mapping[str, bool]], CalibrationResult]:
    """Statistics without data, made once: every wanted tensor saw the same values in [-1, 1]
    (so no exclusion fires and the loop settles in one round).  Measuring costs next to nothing
    here: the figures are placement's own."""
    values = np.linspace(-1.0, 1.0, 256, dtype=np.float32).reshape(1, 256)
    seen = TensorStats("any", histogram=True)
    seen.update(values)

    def measure(wanted: Mapping[str, bool]) -> CalibrationResult:
        return CalibrationResult(dict.fromkeys(wanted, seen), 1)

    return measure


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """The median wall time of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime

    model = chain_model(args.nodes)
    graph = ir.Graph(model)
    print(
        f"placement of a generated chain of {len(graph.nodes)} nodes; median of {args.repeat} "
        f"runs; {cpu_name()} ({os.cpu_count()} cores), Python "
        f"{platform.python_version()}, onnx {onnx.__version__}, onnxruntime "
        f"{onnxruntime.__version__}"
    )
    print(f"{'backend':<12} {'facts':>8} {'annotate':>9} {'place':>8} {'rounds':>6}  quantized")
    worst = 0.0
    for backend, profile in PROFILES.items():
        options = QuantConfig(backend=backend).placement
        facts_s, facts = timed(lambda p=profile: GraphFacts.of(graph, p), args.repeat)
        assert isinstance(facts, GraphFacts)
        annotate_s, _ = timed(lambda f=facts, p=profile, o=options: annotate(f, p, o), args.repeat)
        place_s, placement = timed(
            lambda p=profile, o=options: place(GraphFacts.of(graph, p), p, o, synthetic_measure()),
            args.repeat,
        )
        decisions = placement.annotations.decisions  # type: ignore[attr-defined]
        quantized = sum(d.quantized for d in decisions)
        rounds = placement.rounds  # type: ignore[attr-defined]
        print(
            f"{backend:<12} {facts_s:7.2f}s {annotate_s:8.2f}s {place_s:7.2f}s {rounds:>6}  "
            f"{quantized} of {len(decisions)} ops"
        )
        worst = max(worst, place_s)
    verdict = "meets" if worst < TARGET_S else "MISSES"
    print(f"placement stage (place, facts included): at most {worst:.2f} s, {verdict} {TARGET_S} s")


if __name__ == "__main__":
    main()
