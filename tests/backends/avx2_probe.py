"""Run under ``qemu-x86_64 -cpu Haswell`` by tests/backends/test_avx2_kernels.py: onnxruntime
on an x86-64 CPU without AVX-512 or VNNI, where it picks its AVX2 int8 kernels.

    python avx2_probe.py FOLDER

Prints one JSON line: this onnxq's CPU class as seen there, and for each worst-case one-op
model (u8 255 x s8 127 or 63, or x u8 255 with zero point 128: the weight 127 stored as
uint8) whether the fused int8 result is exact and the ops onnxruntime fused it into.  For
every ``*.onnx`` in FOLDER it runs the model in onnxruntime's default (fused) session on the
batches of ``FOLDER/<name>.feed.npz`` (arrays ``<input>:<i>``) and writes the outputs to
``FOLDER/<name>.fused.npz`` (``<output>:<i>``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CHANNELS = 32
KINDS = ("conv1x1", "conv3x3", "depthwise3x3", "gemm", "matmul", "matmul_float")
WEIGHTS = {"127": (127, np.int8), "63": (63, np.int8), "u8 127": (127, np.uint8)}


def worst_case(kind: str, qmax: int, dtype: type = np.int8) -> tuple[bytes, list[int]]:
    """One op between Q/DQ whose input is all 255 and whose weights are all ``qmax`` (stored
    as ``dtype``: uint8 ones + 128 behind zero point 128); the output scale keeps the exact
    sum inside uint8.  ``matmul_float``: a MatMul whose output stays float (onnxruntime's
    MatMulIntegerToFloat)."""
    c = CHANNELS
    zero = 128 if dtype == np.uint8 else 0
    conv = kind.startswith(("conv", "depthwise"))
    k = 1 if kind == "conv1x1" else 3
    group = c if kind == "depthwise3x3" else 1
    products = c // group * k * k if conv else c
    shape = [1, c, 8, 8] if conv else [4, c]
    w_shape = [c, c // group, k, k] if conv else [c, c]
    inits = [
        numpy_helper.from_array(np.array(1.0, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.uint8), "z"),
        numpy_helper.from_array(np.array(255.0 * qmax * products / 200, np.float32), "so"),
        numpy_helper.from_array(np.full(w_shape, qmax + zero, dtype), "wq"),
        numpy_helper.from_array(np.ones(c, np.float32), "ws"),
        numpy_helper.from_array(np.full(c, zero, dtype), "wz"),
    ]
    axis = 0 if conv else 1
    if conv:
        op = helper.make_node("Conv", ["xd", "w"], ["c"], group=group, pads=[k // 2] * 4)
    else:
        op = helper.make_node("Gemm" if kind == "gemm" else "MatMul", ["xd", "w"], ["c"])
    output = [
        helper.make_node("QuantizeLinear", ["c", "so", "z"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "so", "z"], ["y"]),
    ]
    if kind == "matmul_float":
        output = [helper.make_node("Identity", ["c"], ["y"])]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=axis),
        op,
        *output,
    ]
    graph = helper.make_graph(
        nodes,
        "worst_case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString(), shape


def session(model: bytes | str, fused: bool) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not fused:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def exact(kind: str, qmax: int, dtype: type) -> tuple[bool, list[str]]:
    """Whether the fused result equals the Q/DQ graph's, and the fused graph's op types."""
    import tempfile

    model, shape = worst_case(kind, qmax, dtype)
    feed = {"x": np.full(shape, 255.0, np.float32)}
    fused, plain = (session(model, f).run(None, feed)[0] for f in (True, False))
    with tempfile.TemporaryDirectory() as folder:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.optimized_model_filepath = f"{folder}/fused.onnx"
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]
    return bool(np.array_equal(fused, plain)), ops


def main(folder: Path) -> None:
    from onnxq.backends.cpu import detect

    for path in sorted(folder.glob("*.onnx")):
        with np.load(folder / f"{path.stem}.feed.npz") as z:
            arrays = {k: z[k] for k in z.files}
        sess = session(str(path), True)
        names = [o.name for o in sess.get_outputs()]
        outputs = {}
        for i in range(len(arrays) // len(sess.get_inputs())):
            feed = {inp.name: arrays[f"{inp.name}:{i}"] for inp in sess.get_inputs()}
            outputs.update(
                {f"{n}:{i}": v for n, v in zip(names, sess.run(names, feed), strict=True)}
            )
        np.savez(folder / f"{path.stem}.fused.npz", **outputs)
    cases = {f"{kind} {w}": exact(kind, *WEIGHTS[w]) for kind in KINDS for w in WEIGHTS}
    result = {
        "detected": detect(),
        "exact": {name: found[0] for name, found in cases.items()},
        "fused_ops": {name: found[1] for name, found in cases.items()},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
