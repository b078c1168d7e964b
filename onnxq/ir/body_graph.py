"""The index of one control-flow body: a :class:`~onnxq.ir.graph.Graph` whose lookups of names
the body reads from enclosing scopes are answered by the enclosing graph.

A body's own nodes, initializers, inputs (a Loop's iteration count and carried values, a
Scan's slices) and outputs are indexed as the top-level graph's are, so rules, simplify
passes and materialize work on a body as they work on the top level.  An outer-scope weight
is a constant there, an outer-scope activation is an activation.  Fresh names are unique
across the whole model.  :func:`scopes` indexes a graph and every body inside it.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxq.ir.bodies import Body, child_bodies
from onnxq.ir.graph import ConstInfo, Graph


class BodyGraph(Graph):
    """The index of ``body``; ``outer`` is the graph around it (a body's or the top level's)."""

    def __init__(self, body: Body, outer: Graph) -> None:
        self.body = body
        self.outer = outer
        self.root: Graph = outer.root
        self.model = outer.model
        self.proto = body.graph
        self._const_cache: dict[str, np.ndarray] = {}
        self.reindex()

    def defines(self, name: str) -> bool:
        """Whether the body itself defines ``name`` (not an outer-scope read)."""
        return (
            name in self.initializers
            or name in self.producer
            or name in self.graph_inputs_set()
            or name in self.constant_nodes
        )

    def _here(self, name: str) -> bool:
        return self.defines(name) or name in self.types

    def is_const(self, name: str) -> bool:
        """True for the body's constants and for outer-scope constants it reads."""
        return super().is_const(name) if self.defines(name) else self.outer.is_const(name)

    def const_value(self, name: str) -> np.ndarray | None:
        """The value of a constant of the body or of an enclosing scope."""
        return super().const_value(name) if self.defines(name) else self.outer.const_value(name)

    def const_info(self, name: str) -> ConstInfo | None:
        """Shape and element type of a constant of the body or of an enclosing scope."""
        return super().const_info(name) if self.defines(name) else self.outer.const_info(name)

    def elem_type(self, name: str) -> int | None:
        """The element type, from the body's types or the enclosing scope's."""
        return super().elem_type(name) if self._here(name) else self.outer.elem_type(name)

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        """The inferred shape, from the body's types or the enclosing scope's."""
        return super().shape(name) if self._here(name) else self.outer.shape(name)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """A ValueInfo for ``name``, from the body's types or the enclosing scope's."""
        return super().value_info(name) if self._here(name) else self.outer.value_info(name)

    def _shape_probes(self) -> list[dict[str, tuple[int | str, ...]]]:
        return []  # probing re-infers the model from its inputs: nothing to say about a body

    def _names(self) -> set[str]:
        return self.root._names()  # fresh names are unique across the whole model


def child_graphs(graph: Graph) -> list[Graph]:
    """Indexes of the bodies of ``graph``'s own If/Loop/Scan nodes (made afresh: an edit of a
    graph's node list detaches the indexes of the bodies inside it)."""
    return [BodyGraph(b, graph) for b in child_bodies(graph.proto, getattr(graph, "body", None))]


def scopes(graph: Graph) -> list[Graph]:
    """``graph``, then the indexes of every If/Loop/Scan body inside it, depth first (a body
    before the bodies inside it)."""
    out = [graph]
    for child in child_graphs(graph):
        out.extend(scopes(child))
    return out


def scope_index(graphs: list[Graph]) -> dict[str, Graph]:
    """Value name -> the graph among ``graphs`` (from :func:`scopes`) that defines it."""
    found: dict[str, Graph] = {}
    for scope in graphs:
        for name in (*scope.initializers, *scope.producer, *scope.graph_inputs):
            found.setdefault(name, scope)
    return found
