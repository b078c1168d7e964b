"""``onnxq tune-cpu``: measure the onnxruntime cost thresholds on this machine.

Each threshold of :class:`onnxq.backends.cost_tables.CostTable` says when an op's int8 kernel
pays by itself, that is with its own QuantizeLinear before it and DequantizeLinear after it
(an op below the thresholds still gets int8 inside a chain of integer kernels, where those are
shared).  Each is answered by timing one-conv models against their float form, whole session,
one intra-op thread, median of the runs:

* ``min_macs_per_output``: 1x1 convs C -> C and 3x3 convs over 4 and 8 channels (56x56); the
  fewest products per output element from which every measured int8 conv beats float.
* ``min_macs_per_output_unaligned``: the same for 3x3 convs over 3, 5, 6, 7, 9, 10, 11, 13
  and 14 channels (not a multiple of ``channel_alignment``).
* ``float_grouped_convs``: whether some 3x3 depthwise conv loses in int8.
* ``min_macs``: a 1x1 64 -> 64 conv on 1x1 to 16x16 maps: the fewest multiply-adds per sample
  from which int8 wins.

Timing is noisy on a busy machine, and per-op thresholds cannot see whole chains: check a
model's result with ``scripts/bench_latency.py``.  The table is written once and then passed
to ``quantize``, so outputs stay deterministic.  :func:`conv_kernel_us` (the conv node's own
kernel time, from onnxruntime's profiler) is what ``scripts/bench_conv_kernels.py`` prints.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxq.backends.cost_tables import CostTable
from onnxq.backends.cpu import this_machine

NEVER = 1 << 30  # a threshold no op reaches: int8 never paid in the measurement
ALIGNMENT = 4  # input channels the int8 conv kernels take per step (not measured)


@dataclass(frozen=True)
class ConvCase:
    """One conv to time: [1, cin, hw, hw] -> cout channels, ``kernel`` x ``kernel``."""

    cin: int
    cout: int
    kernel: int
    hw: int
    group: int = 1

    @property
    def products(self) -> int:
        """Products summed per output element."""
        return self.cin // self.group * self.kernel * self.kernel

    @property
    def macs(self) -> int:
        """Multiply-adds per sample."""
        return self.products * self.cout * self.hw * self.hw


def conv_model(case: ConvCase, int8: bool, weight_dtype: str = "int8") -> bytes:
    """One conv, float or in the Q/DQ form onnxruntime fuses into a QLinearConv, its weights
    stored as ``weight_dtype`` (uint8: the int8 values + 128, zero point 128), the type onnxq
    stores them in for the CPU class (:class:`onnxq.backends.cpu.CpuClass`)."""
    rng = np.random.default_rng(0)
    c = case
    w = (rng.standard_normal((c.cout, c.cin // c.group, c.kernel, c.kernel)) * 0.1).astype(
        np.float32
    )
    inits = [numpy_helper.from_array((rng.standard_normal(c.cout) * 0.1).astype(np.float32), "b")]
    nodes, x = [], "x"
    dtype = np.dtype(weight_dtype)
    zero = 128 if dtype == np.uint8 else 0
    if int8:
        inits += [
            numpy_helper.from_array(np.array(0.02, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.uint8), "z"),
            numpy_helper.from_array(
                (np.clip(np.round(w / 0.01), -127, 127) + zero).astype(dtype), "wq"
            ),
            numpy_helper.from_array(np.full(c.cout, 0.01, np.float32), "ws"),
            numpy_helper.from_array(np.full(c.cout, zero, dtype), "wz"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
        ]
        x = "xd"
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    pads = [c.kernel // 2] * 4
    nodes.append(
        helper.make_node("Conv", [x, "w", "b"], ["c"], name="conv", pads=pads, group=c.group)
    )
    out = "c"
    if int8:
        nodes += [
            helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
            helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"]),
        ]
        out = "y"
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c.cin, c.hw, c.hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _session(model: bytes, profile: bool) -> object:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), "onnxq_tune")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _feed(case: ConvCase) -> dict[str, np.ndarray]:
    shape = (1, case.cin, case.hw, case.hw)
    return {"x": np.random.default_rng(1).random(shape, dtype=np.float32)}


def conv_kernel_us(model: bytes, case: ConvCase, runs: int) -> tuple[float, str]:
    """Median kernel time (microseconds) of the model's conv node, and its op type."""
    sess = _session(model, profile=True)
    feed, warmup = _feed(case), 3
    for _ in range(warmup + runs):
        sess.run(None, feed)  # type: ignore[attr-defined]
    path = sess.end_profiling()  # type: ignore[attr-defined]
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["args"]["op_name"]].append(float(e["dur"]))
    for op in ("QLinearConv", "Conv", "FusedConv"):
        if op in times:
            return statistics.median(times[op][warmup:]), op
    raise RuntimeError(f"no conv kernel in the profile (ops: {sorted(times)})")


def session_us(model: bytes, case: ConvCase, runs: int) -> float:
    """Median wall time (microseconds) of one whole run."""
    sess, feed = _session(model, profile=False), _feed(case)
    for _ in range(3):
        sess.run(None, feed)  # type: ignore[attr-defined]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feed)  # type: ignore[attr-defined]
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


ALIGNED = [ConvCase(c, c, 1, 56) for c in (8, 16, 24, 32, 48, 64, 96)] + [
    ConvCase(c, 32, 3, 56) for c in (4, 8)
]
UNALIGNED = [ConvCase(c, 32, 3, 56) for c in (3, 5, 6, 7, 9, 10, 11, 13, 14)]
DEPTHWISE = [ConvCase(c, c, 3, hw, group=c) for c, hw in ((96, 56), (144, 28), (384, 14))]
SMALL = [ConvCase(64, 64, 1, hw) for hw in (1, 2, 4, 8, 16)]


def pays_from(ratios: list[tuple[int, float]]) -> int:
    """The smallest size from which every measured (size, float / int8) pair has int8 at
    least as fast; :data:`NEVER` if the largest does not."""
    threshold = NEVER
    for size, ratio in sorted(ratios, reverse=True):
        if ratio < 1.0:
            break
        threshold = size
    return threshold


def tune_cost_table(runs: int = 60, log: Callable[[str], None] = print) -> CostTable:
    """Time the candidate convs on this machine and derive its cost table."""
    import onnxruntime as ort

    target = this_machine()

    def ratio(case: ConvCase) -> float:
        f = session_us(conv_model(case, False), case, runs)
        q = session_us(conv_model(case, True, target.cpu.weight_dtype), case, runs)
        log(
            f"  conv {case.kernel}x{case.kernel} {case.cin}->{case.cout} group {case.group} "
            f"{case.hw}x{case.hw} ({case.macs} MACs): float {f:.1f} us, int8 with its Q/DQ "
            f"{q:.1f} us, float/int8 {f / q:.2f}"
        )
        return f / q

    log(
        f"int8 (with its own Q/DQ; {target.cpu.weight_dtype} weights) against float, one "
        "thread; aligned input channels:"
    )
    aligned = pays_from([(c.products, ratio(c)) for c in ALIGNED])
    log("unaligned input channels:")
    unaligned = pays_from([(c.products, ratio(c)) for c in UNALIGNED])
    log("depthwise:")
    depthwise_loses = min(ratio(c) for c in DEPTHWISE) < 1.0
    log("small maps:")
    small = pays_from([(c.macs, ratio(c)) for c in SMALL])
    return CostTable(
        cpu=target.name,
        measured_on=f"{cpu_model()} ({target.name}), onnxruntime {ort.__version__}",
        float_grouped_convs=depthwise_loses,
        min_macs_per_output=aligned,
        channel_alignment=ALIGNMENT,
        min_macs_per_output_unaligned=max(unaligned, aligned),
        min_macs=small,
    )


def cpu_model() -> str:
    """The CPU's model name as the OS gives it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


__all__ = ["ConvCase", "conv_kernel_us", "conv_model", "tune_cost_table"]
