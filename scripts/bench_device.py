"""Calibration on the CPU vs on CUDA (``--device cuda``): wall time of the quantization and how
far the two outputs' scales are apart (docs/scale.md).

    python scripts/bench_device.py [--model M.onnx --calib DIR] [--repeats 3]

Needs ``onnxruntime-gpu`` and a CUDA device for the CUDA column; without them it prints which
is missing (the error a user gets) and measures the CPU only.  Runs alternate CPU and CUDA
in this process; medians are printed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def _scales(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[1] in inits:
            out[node.input[0]] = numpy_helper.to_array(inits[node.input[1]])
    return out


def _gpu() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "no GPU listed"
    except OSError:
        return "no nvidia-smi"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "examples/digits/digits_cnn.onnx"))
    parser.add_argument("--calib", default=str(ROOT / "examples/digits/calib"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime as ort

    import onnxq
    from onnxq.errors import ResourceError
    from onnxq.runtime.device import check_device

    print(f"model {Path(args.model).name}; calibration {args.calib}")
    print(
        f"onnxruntime {ort.__version__} ({', '.join(ort.get_available_providers())}); "
        f"{_gpu()}; CPU {platform.processor() or platform.machine()}"
    )
    devices = ["cpu"]
    try:
        check_device("cuda")
        devices.append("cuda")
    except ResourceError as exc:
        print(f"CUDA not measured: {exc}")
    times: dict[str, list[float]] = {d: [] for d in devices}
    outputs: dict[str, onnx.ModelProto] = {}
    for _ in range(args.repeats):
        for name in devices:
            began = time.perf_counter()
            result = onnxq.quantize(args.model, args.calib, progress=False, device=name)
            times[name].append(time.perf_counter() - began)
            outputs[name] = result.model
    for name in devices:
        print(f"  {name:5s} median {statistics.median(times[name]):.2f} s over {args.repeats}")
    if "cuda" in outputs:
        cpu, gpu = _scales(outputs["cpu"]), _scales(outputs["cuda"])
        same = cpu.keys() == gpu.keys()
        worst = max(
            (float(np.max(np.abs(gpu[k] / cpu[k] - 1))) for k in cpu if k in gpu), default=0.0
        )
        identical = outputs["cpu"].SerializeToString() == outputs["cuda"].SerializeToString()
        ratio = statistics.median(times["cuda"]) / statistics.median(times["cpu"])
        print(f"  cuda / cpu wall: {ratio:.2f}x")
        print(f"  same quantized tensors: {same}; largest relative scale difference {worst:.2e}")
        print(f"  outputs byte-identical: {identical}")


if __name__ == "__main__":
    main()
