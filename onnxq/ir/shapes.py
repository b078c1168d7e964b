"""Shape inference that never serialises large weights, and shapes for given input shapes."""

from __future__ import annotations

import onnx

from onnxq.ir.bodies import all_bodies
from onnxq.ir.weightless import weights_stripped

# ai.onnx.ml ops whose output has their input's shape (element type: None = the input's),
# for which onnx has no shape inference: a scikit-learn pipeline's shapes stop at its Scaler
_ML_SAME_SHAPE = {
    "Scaler": onnx.TensorProto.FLOAT,
    "Normalizer": onnx.TensorProto.FLOAT,
    "Binarizer": None,
    "Imputer": None,
}


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that never serialises large weights (works past 2 GB), continued past
    the shape-preserving ``ai.onnx.ml`` ops onnx cannot read (:data:`_ML_SAME_SHAPE`)."""
    with weights_stripped(model) as light:
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except Exception:  # inference is a help, not a requirement
            return model
        for _ in range(len(model.graph.node)):
            extra = _ml_same_shapes(inferred.graph)
            if not extra:
                break
            inferred.graph.value_info.extend(extra)
            try:
                inferred = onnx.shape_inference.infer_shapes(
                    inferred, strict_mode=False, data_prop=True
                )
            except Exception:  # keep what the first pass and the ML shapes gave
                break
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for dst, src in zip(model.graph.output, inferred.graph.output, strict=True):
        dst.CopyFrom(src)
    _copy_body_types(model.graph, inferred.graph)
    return model


def _copy_body_types(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    """The inferred types of the values inside control-flow bodies (same structure)."""
    pairs = list(zip(all_bodies(graph), all_bodies(inferred), strict=False))
    for body, done in pairs:
        if body.key != done.key or len(body.graph.output) != len(done.graph.output):
            return  # not the same structure: keep the model's own annotations
        del body.graph.value_info[:]
        body.graph.value_info.extend(done.graph.value_info)
        for dst, src in zip(body.graph.output, done.graph.output, strict=True):
            if src.type.HasField("tensor_type"):
                dst.CopyFrom(src)


def _ml_same_shapes(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Value infos for the outputs of :data:`_ML_SAME_SHAPE` ops whose input shape is known and
    whose own is not."""
    known = {
        vi.name: vi
        for vi in (*graph.input, *graph.value_info, *graph.output)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    }
    extra = []
    for node in graph.node:
        if (
            node.domain != "ai.onnx.ml"
            or node.op_type not in _ML_SAME_SHAPE
            or not node.input
            or node.input[0] not in known
            or not node.output
            or node.output[0] in known
        ):
            continue
        source = known[node.input[0]].type.tensor_type
        elem = _ML_SAME_SHAPE[node.op_type] or source.elem_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in source.shape.dim
        ]
        extra.append(onnx.helper.make_tensor_value_info(node.output[0], elem, dims))
    return extra


def shapes_for_inputs(
    model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int | str, ...]]:
    """Every tensor's shape when the graph inputs have these concrete shapes (best effort)."""
    with weights_stripped(model) as light:
        for vi in light.graph.input:
            if vi.name in inputs and vi.type.HasField("tensor_type"):
                dims = vi.type.tensor_type.shape.dim
                del dims[:]
                for d in inputs[vi.name]:
                    dims.add().dim_value = int(d)
        del light.graph.value_info[:]
        for vi in light.graph.output:  # inferred afresh too: a model's declarations go stale
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
        except Exception:
            return {}
    out: dict[str, tuple[int | str, ...]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            out[vi.name] = tuple(
                d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                for d in vi.type.tensor_type.shape.dim
            )
    return out
