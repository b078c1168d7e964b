#!/usr/bin/env python3
"""onnxruntime's float Conv against its int8 QLinearConv on this CPU: the measurements behind
the onnxruntime profile's cost thresholds (``min_macs_per_output``,
``min_macs_per_output_unaligned``; ``onnxq/rewrites/cost.py``).

    python scripts/bench_conv_kernels.py --kernel 1,3 --cin 3,8,10,12,16 --cout 16,32 --hw 56

For every combination it builds two one-conv models, ``x -> Conv -> y`` and the Q/DQ form
``x -> Q -> DQ -> Conv(DQ(int8 weight)) -> Q -> DQ -> y`` that onnxruntime fuses into a
QLinearConv, runs each under onnxruntime's profiler on one thread and prints the median kernel
time of the Conv node alone (no Q/DQ, layout or reorder nodes: inside a chain of convs those
are shared) and float / int8 (> 1: int8 is faster).  Use it to re-derive the thresholds on
another CPU; the numbers for the machine onnxq was tuned on are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def conv_model(cin: int, cout: int, kernel: int, hw: int, int8: bool) -> bytes:
    """One ``kernel`` x ``kernel`` conv over [1, cin, hw, hw], float or in Q/DQ form."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin, kernel, kernel)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), "b")]
    nodes, x, out = [], "x", "c"
    if int8:
        inits += [
            numpy_helper.from_array(np.array(0.02, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.uint8), "z"),
            numpy_helper.from_array(np.clip(np.round(w / 0.01), -127, 127).astype(np.int8), "wq"),
            numpy_helper.from_array(np.full(cout, 0.01, np.float32), "ws"),
            numpy_helper.from_array(np.zeros(cout, np.int8), "wz"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
        ]
        x = "xd"
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes.append(
        helper.make_node("Conv", [x, "w", "b"], ["c"], name="conv", pads=[kernel // 2] * 4)
    )
    if int8:
        nodes += [
            helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
            helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"]),
        ]
        out = "y"
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def conv_kernel_us(model: bytes, cin: int, hw: int, runs: int) -> tuple[float, str]:
    """Median kernel time of the model's conv node (float Conv or fused QLinearConv)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), "onnxq_conv_kernels")
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feed = {"x": np.random.default_rng(1).random((1, cin, hw, hw), dtype=np.float32)}
    warmup = 5
    for _ in range(warmup + runs):
        sess.run(None, feed)
    profile = sess.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["args"]["op_name"]].append(float(e["dur"]))
    for op in ("QLinearConv", "Conv", "FusedConv"):
        if op in times:
            return statistics.median(times[op][warmup:]), op
    raise RuntimeError(f"no conv kernel in the profile (ops: {sorted(times)})")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernel", type=_ints, default=[1, 3], help="kernel sizes (default 1,3)")
    ap.add_argument("--cin", type=_ints, default=[3, 4, 8, 10, 12, 16, 32], help="input channels")
    ap.add_argument("--cout", type=_ints, default=[16, 64], help="output channels")
    ap.add_argument("--hw", type=_ints, default=[56], help="input height = width")
    ap.add_argument("--runs", type=int, default=40, help="timed runs per model")
    args = ap.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, one thread; kernel time of the conv node, median")
    for kernel, cin, cout, hw in itertools.product(args.kernel, args.cin, args.cout, args.hw):
        f, _ = conv_kernel_us(conv_model(cin, cout, kernel, hw, False), cin, hw, args.runs)
        q, op = conv_kernel_us(conv_model(cin, cout, kernel, hw, True), cin, hw, args.runs)
        print(
            f"k={kernel} cin={cin:4d} cout={cout:4d} hw={hw:4d} products/output="
            f"{cin * kernel * kernel:5d}  float {f:9.1f} us  int8 {q:9.1f} us ({op})  "
            f"float/int8 {f / q:5.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
