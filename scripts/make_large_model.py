"""Write a synthetic large float ONNX model (a MatMul/Gemm stack) with all weights in one
external ``.data`` file.

Usage::

    python scripts/make_large_model.py OUT.onnx --gb 2.2 [--layers N] [--width 4096] [--seed 0]

The model is ``x[1, W] -> (MatMul | Gemm+bias) -> Relu -> ... -> y[1, W]``: even layers are
``MatMul(x, W[K, N])``, odd layers ``Gemm(x, W[N, K], bias, transB=1)``, with a Relu between
layers.  Weights are scaled by ``1/sqrt(W)`` (times ``sqrt(2)`` after a Relu) so activations stay
O(1) through any depth.  A ``W = 4096`` weight is 64 MiB; ``--gb 2.2`` gives 35 layers, past
protobuf's 2 GiB message limit (the case ``onnxq`` must handle with external data).

Memory: each weight is generated, appended to ``OUT.onnx.data`` and dropped before the next one;
the ``.onnx`` header (TensorProtos that only point into the data file) is built by hand, so the
writer never holds more than one layer's weight.  Peak memory is about one weight.

Importable: :func:`build_large_model` (used by ``tests/test_reliability.py`` at ~20 MB).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

GIB = 2**30
ALIGN = 4096  # data offsets aligned like onnx's own external-data writer (mmap friendly)
OPSET = 17


def layers_for(total_bytes: float, width: int) -> int:
    """How many ``width x width`` float32 weights make ``total_bytes`` (at least 1)."""
    return max(1, round(total_bytes / (width * width * 4)))


def _external(name: str, dims: list[int], location: str, offset: int, length: int) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    t.external_data.add(key="offset", value=str(offset))
    t.external_data.add(key="length", value=str(length))
    return t


class _DataWriter:
    """Appends arrays to the data file (4 KiB aligned) and returns external TensorProtos."""

    def __init__(self, fh, location: str):
        self.fh = fh
        self.location = location
        self.offset = 0

    def add(self, name: str, value: np.ndarray) -> TensorProto:
        value = np.ascontiguousarray(value, dtype=np.float32)
        pad = (-self.offset) % ALIGN
        if pad:
            self.fh.write(b"\0" * pad)
            self.offset += pad
        self.fh.write(memoryview(value).cast("B"))  # no copy of the array
        tensor = _external(name, list(value.shape), self.location, self.offset, value.nbytes)
        self.offset += value.nbytes
        return tensor


def build_large_model(
    out: str | os.PathLike[str],
    *,
    total_bytes: float | None = None,
    layers: int | None = None,
    width: int = 4096,
    seed: int = 0,
    verbose: bool = False,
) -> tuple[Path, Path]:
    """Write ``out`` and ``out + '.data'``; returns both paths.

    Give ``layers`` or ``total_bytes`` (the weights' size; ``layers`` wins).  Same arguments,
    same bytes.
    """
    out = Path(out)
    if layers is None:
        if total_bytes is None:
            raise ValueError("give layers or total_bytes")
        layers = layers_for(total_bytes, width)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_path = out.with_name(out.name + ".data")
    location = data_path.name
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    current = "x"
    with open(data_path, "wb") as fh:
        writer = _DataWriter(fh, location)
        for i in range(layers):
            gain = math.sqrt(2.0 if i else 1.0) / math.sqrt(width)
            weight = rng.standard_normal((width, width), dtype=np.float32)
            weight *= np.float32(gain)
            out_name = "y" if i == layers - 1 else f"layer{i}_out"
            if i % 2 == 0:
                inits.append(writer.add(f"layer{i}.weight", weight))  # [K, N]
                nodes.append(
                    helper.make_node(
                        "MatMul", [current, f"layer{i}.weight"], [out_name], name=f"layer{i}/MatMul"
                    )
                )
            else:
                inits.append(writer.add(f"layer{i}.weight", weight))  # [N, K], transB=1
                bias = rng.standard_normal(width, dtype=np.float32) * np.float32(0.01)
                inits.append(writer.add(f"layer{i}.bias", bias))
                nodes.append(
                    helper.make_node(
                        "Gemm",
                        [current, f"layer{i}.weight", f"layer{i}.bias"],
                        [out_name],
                        name=f"layer{i}/Gemm",
                        transB=1,
                    )
                )
            del weight
            current = out_name
            if i < layers - 1:
                nodes.append(
                    helper.make_node("Relu", [current], [f"layer{i}_relu"], name=f"layer{i}/Relu")
                )
                current = f"layer{i}_relu"
            if verbose:
                print(
                    f"\rlayer {i + 1}/{layers}: {writer.offset / GIB:.2f} GiB",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        fh.flush()
        os.fsync(fh.fileno())
    if verbose:
        print(file=sys.stderr)
    graph = helper.make_graph(
        nodes,
        "large_stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="onnxq-make-large-model",
    )
    model.ir_version = 8
    out.write_bytes(model.SerializeToString())  # the header only: a few KB
    return out, data_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", help="output .onnx path (the data goes to OUT.data)")
    p.add_argument("--gb", type=float, default=2.2, help="weight size in GiB (default 2.2)")
    p.add_argument("--layers", type=int, help="number of layers (overrides --gb)")
    p.add_argument("--width", type=int, default=4096, help="layer width (default 4096)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.width < 1 or (args.layers is not None and args.layers < 1) or args.gb <= 0:
        p.error("--width, --layers and --gb must be positive")
    model, data = build_large_model(
        args.out,
        total_bytes=args.gb * GIB,
        layers=args.layers,
        width=args.width,
        seed=args.seed,
        verbose=True,
    )
    size = model.stat().st_size + data.stat().st_size
    print(
        f"wrote {model} ({model.stat().st_size} bytes) and {data} "
        f"({data.stat().st_size / GIB:.3f} GiB); total {size / GIB:.3f} GiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
