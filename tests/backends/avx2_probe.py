"""Run under ``qemu-x86_64 -cpu Haswell`` by tests/backends/test_avx2_kernels.py: onnxruntime
on an x86-64 CPU without AVX-512 or VNNI, where it picks its AVX2 int8 kernels.

    python avx2_probe.py FOLDER

Prints one JSON line: this onnxq's CPU class as seen there, and for each worst-case one-op
model (u8 255 x s8 127 or 63) whether the fused int8 result is exact.  For every ``*.onnx`` in
FOLDER it runs the model in onnxruntime's default (fused) session on the batches of
``FOLDER/<name>.feed.npz`` (arrays ``<input>:<i>``) and writes the outputs to
``FOLDER/<name>.fused.npz`` (``<output>:<i>``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CHANNELS = 32
KINDS = ("conv1x1", "conv3x3", "depthwise3x3", "gemm", "matmul")


def worst_case(kind: str, qmax: int) -> tuple[bytes, list[int]]:
    """One op between Q/DQ whose input is all 255 and whose weights are all ``qmax``; the
    output scale keeps the exact sum inside uint8."""
    c = CHANNELS
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
        numpy_helper.from_array(np.full(w_shape, qmax, np.int8), "wq"),
        numpy_helper.from_array(np.ones(c, np.float32), "ws"),
        numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
    ]
    axis = 0 if conv else 1
    if conv:
        op = helper.make_node("Conv", ["xd", "w"], ["c"], group=group, pads=[k // 2] * 4)
    else:
        op = helper.make_node("MatMul" if kind == "matmul" else "Gemm", ["xd", "w"], ["c"])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=axis),
        op,
        helper.make_node("QuantizeLinear", ["c", "so", "z"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "so", "z"], ["y"]),
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


def exact(kind: str, qmax: int) -> bool:
    model, shape = worst_case(kind, qmax)
    feed = {"x": np.full(shape, 255.0, np.float32)}
    fused, plain = (session(model, f).run(None, feed)[0] for f in (True, False))
    return bool(np.array_equal(fused, plain))


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
    result = {
        "detected": detect(),
        "exact": {f"{kind} {q}": exact(kind, q) for kind in KINDS for q in (127, 63)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
