"""Shapes under probe sizes: every tensor's inferred shape with the model's dynamic input
dimensions set to concrete sizes, so that two symbolic shapes can be compared."""

from __future__ import annotations

from typing import Protocol

import onnx

from onnxq.ir.shapes import shapes_for_inputs


class ProbedGraph(Protocol):
    """What the probes read of a graph index (:class:`onnxq.ir.graph.Graph`)."""

    model: onnx.ModelProto
    graph_inputs: list[str]

    def shape(self, name: str) -> tuple[int | str | None, ...] | None: ...


# (base, spread) of each probe: symbol k of the inputs gets size base + spread * k
PROBE_SIZES = ((256, 32), (384, 64))


def symbolic_input_dims(
    graph: ProbedGraph,
) -> tuple[dict[str, list[int | str | None]], dict[str, int]] | None:
    """Each graph input's dimensions, a dynamic one replaced by its symbol (its dim_param, or
    ``input:axis`` when it has none), and each symbol's number; None when an input's rank is
    unknown."""
    symbols: dict[str, int] = {}
    shapes: dict[str, list[int | str | None]] = {}
    for name in graph.graph_inputs:
        shape = graph.shape(name)
        if shape is None:
            return None
        dims: list[int | str | None] = []
        for k, d in enumerate(shape):
            key = d if isinstance(d, str) else f"{name}:{k}"
            if not isinstance(d, int):
                symbols.setdefault(key, len(symbols))
            dims.append(d if isinstance(d, int) else key)
        shapes[name] = dims
    return shapes, symbols


def probe_shapes(graph: ProbedGraph) -> list[dict[str, tuple[int | str, ...]]]:
    """Every tensor's inferred shape with the dynamic input dimensions set to two different
    sizes (multiples of 32; one size per symbol, so dimensions that share a name stay equal);
    [] when the inputs' ranks are unknown or no dimension is dynamic."""
    found = symbolic_input_dims(graph)
    if found is None or not found[1]:
        return []
    shapes, symbols = found
    probes = []
    for base, spread in PROBE_SIZES:
        concrete = {
            name: tuple(d if isinstance(d, int) else base + spread * symbols[str(d)] for d in dims)
            for name, dims in shapes.items()
        }
        probes.append(shapes_for_inputs(graph.model, concrete))
    return probes
