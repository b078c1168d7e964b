"""Per-layer decisions of a weight-only run between finding the layers and quantizing them:
which algorithm ``auto`` means, one format for a weight several layers read, and the record
the report keeps of each layer."""

from __future__ import annotations

from dataclasses import replace

from onnxq.weightonly.engine import Quantized
from onnxq.weightonly.outcome import LayerRecord, SharedWeight
from onnxq.weightonly.targets import Layer

# measured default (docs/weight-only.md): smollm2 int4/128 proxy perplexity gptq 21.02,
# awq+gptq 20.78 (act-order)
DEFAULT_ALGORITHM = "awq+gptq"


def resolve_algorithm(layer: Layer, has_data: bool) -> Layer:
    """``auto``: :data:`DEFAULT_ALGORITHM` for a layer with an input and calibration data,
    else round to nearest."""
    if layer.algorithm == "auto":
        return replace(
            layer, algorithm=DEFAULT_ALGORITHM if has_data and layer.activation else "rtn"
        )
    return layer


def share_weights(layers: list[Layer]) -> tuple[list[Layer], list[SharedWeight]]:
    """Layers that read one weight share its storage: they get one format (the widest their
    settings ask for) and round to nearest (there is no single input to calibrate it
    against).  Returns the layers and the shared weights."""
    readers: dict[str, list[Layer]] = {}
    for x in layers:
        readers.setdefault(x.weight, []).append(x)
    out: list[SharedWeight] = []
    changed: dict[str, Layer] = {}
    for weight, group in readers.items():
        if len(group) < 2:
            continue
        fmt = max((x.fmt for x in group), key=lambda f: (f.bits, -(f.block_size or 1 << 30)))
        for x in group:
            changed[x.node] = replace(x, fmt=fmt, algorithm="rtn")
        out.append(SharedWeight(weight, tuple(x.node for x in group), fmt))
    return [changed.get(x.node, x) for x in layers], out


def record(layer: Layer, result: Quantized) -> LayerRecord:
    """What the report keeps of one quantized layer."""
    return LayerRecord(
        layer.node,
        layer.op_type,
        layer.weight,
        result.codes.fmt.describe(),
        result.algorithm + (" (input scales)" if result.input_scale is not None else ""),
        result.note or layer.why,
        result.error,
    )
