"""Stages: a model cut at the tensors that live between groups of its layers.

Layerwise calibration (Sparsebit's quantized-prefix mode) needs the input of each layer group
computed with the groups before it already quantized.  Running the whole model once per group
costs a full pass each; instead the graph is cut into stages: stage ``k`` holds the nodes that
its targets (the input tensors of group ``k``) need and no earlier stage computed.  A stage
reads the tensors earlier stages (or the model's inputs) produced and writes those that later
stages read: the live tensors at the cut.  Each node runs once per batch over all stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxq.ir.constants import DEFAULT_DOMAINS
from onnxq.ir.order import node_reads


@dataclass(frozen=True)
class Stage:
    """One cut of a model.

    Attributes:
        nodes: indices into ``model.graph.node`` (in graph order) that this stage runs.
        inputs: tensors it reads from the model's inputs or from earlier stages.
        outputs: its targets first, then the tensors that later stages read.
        targets: the tensors asked for at this stage.
        initializers: the constants its nodes read.
    """

    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    targets: tuple[str, ...]
    initializers: tuple[str, ...]


def plan_stages(model: onnx.ModelProto, targets: Sequence[Sequence[str]]) -> list[Stage]:
    """Cut ``model`` so that stage ``k`` ends with ``targets[k]`` computed.

    The model's nodes must be in topological order (``onnxq.ir.load_model`` sorts them).
    A target that an earlier stage already produced (or a model input) gives a stage with no
    nodes.  Nodes no target needs (the layers after the last one) belong to no stage.
    """
    graph = model.graph
    nodes = list(graph.node)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    constants = {t.name for t in graph.initializer}
    reads = [node_reads(n) for n in nodes]
    owner: dict[int, int] = {}  # node index -> stage
    for k, group in enumerate(targets):
        todo = [t for t in group if t in producer]
        while todo:
            i = producer[todo.pop()]
            if i in owner:
                continue
            owner[i] = k
            todo.extend(x for x in reads[i] if x in producer and producer[x] not in owner)
    by_stage: list[list[int]] = [[] for _ in targets]
    for i in sorted(owner):
        by_stage[owner[i]].append(i)
    made_in: dict[str, int] = {}
    for i, k in owner.items():
        for out in nodes[i].output:
            if out:
                made_in[out] = k
    read_in: dict[str, int] = {}  # tensor -> the last stage that reads it
    for i, k in owner.items():
        for x in reads[i]:
            read_in[x] = max(read_in.get(x, -1), k)
    for k, group in enumerate(targets):
        for t in group:
            read_in[t] = max(read_in.get(t, -1), k)
    stages = []
    for k, group in enumerate(targets):
        own = by_stage[k]
        produced = {o for i in own for o in nodes[i].output if o}
        consumed = sorted({x for i in own for x in reads[i]})
        inputs = [x for x in consumed if x not in produced and x not in constants]
        inputs += [t for t in group if t not in produced and t not in inputs]
        later = [t for t in sorted(produced) if read_in.get(t, -1) > k and t not in group]
        stages.append(
            Stage(
                nodes=tuple(own),
                inputs=tuple(inputs),
                outputs=tuple(dict.fromkeys([*group, *later])),
                targets=tuple(group),
                initializers=tuple(x for x in consumed if x in constants),
            )
        )
    return stages


def last_reader(stages: Sequence[Stage]) -> dict[str, int]:
    """For each tensor a stage reads, the last stage that reads it (or asks for it): after that
    stage it can be dropped."""
    out: dict[str, int] = {}
    for k, stage in enumerate(stages):
        for x in (*stage.inputs, *stage.targets):
            out[x] = k
    return out


def stage_model(
    model: onnx.ModelProto,
    stage: Stage,
    input_types: dict[str, int],
    weights: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """The stage as a model of its own: ``input_types`` gives each input's ONNX element type
    (shapes stay open); ``weights`` replaces the values of some initializers (the quantized
    layers seen as float).  Other initializers are copied as they are (a weight left on disk
    stays a reference to its file)."""
    graph = model.graph
    weights = weights or {}
    wanted = set(stage.initializers)
    inits = []
    for tensor in graph.initializer:
        if tensor.name not in wanted:
            continue
        if tensor.name in weights:
            inits.append(
                numpy_helper.from_array(np.ascontiguousarray(weights[tensor.name]), tensor.name)
            )
        else:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            inits.append(copy)
    body = [graph.node[i] for i in stage.nodes]
    inputs = [helper.make_tensor_value_info(x, input_types[x], None) for x in stage.inputs]
    types = {vi.name: vi.type for vi in (*graph.input, *graph.value_info, *graph.output)}
    outputs = []
    for x in stage.outputs:
        vi = onnx.ValueInfoProto(name=x)
        if x in types and types[x].HasField("tensor_type"):
            vi.type.tensor_type.elem_type = types[x].tensor_type.elem_type
        elif x in input_types:
            vi.type.tensor_type.elem_type = input_types[x]
        else:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        outputs.append(vi)
    out = helper.make_model(
        helper.make_graph(body, f"{graph.name}_stage", inputs, outputs, inits),
        opset_imports=list(model.opset_import),
    )
    out.ir_version = model.ir_version
    out.functions.extend(model.functions)
    if not any(imp.domain in DEFAULT_DOMAINS for imp in out.opset_import):
        out.opset_import.add(domain="", version=13)
    return out
