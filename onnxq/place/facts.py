"""Facts about the graph that placement reads, computed once per run.

:class:`GraphFacts` is a frozen value indexed by name: every lookup during placement is O(1),
and the walks behind it (shape paths, precision paths, heads, score maps, grouped convs,
position-normalised convs, where readers saturate) run once, however many rounds the
placement loop takes.  The graph itself must not change while its facts are in use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TypeVar

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.place.heads import head_nodes, score_maps
from onnxq.place.paths import (
    gated_products,
    grouped_conv_inputs,
    position_norm_convs,
    precision_paths,
    shape_path,
)

Bounds = tuple[float, float]
K = TypeVar("K")
V = TypeVar("V")

# ops whose output stays the same beyond a fixed input bound (attribute-free; Clip and
# HardSigmoid take theirs from the node)
SATURATION_BOUNDS: dict[str, Bounds] = {
    "Relu": (0.0, math.inf),
    "HardSwish": (-3.0, math.inf),
}


@dataclass(frozen=True)
class GraphFacts:
    """What placement knows about ``graph`` before it sees any data.

    The facts cover the whole model, the If/Loop/Scan bodies inside ``graph`` included (node
    and tensor names are unique across the model, ``onnxq.ir.name_nodes``): ``bodies`` holds
    their indexes, and :meth:`within` gives the facts that the rules read while they place a
    body's nodes.

    Attributes:
        graph: the graph the rules walk: the top-level graph, or (:meth:`within`) a body
            (read, never edited, while these facts are in use).
        nodes: node name -> node.
        shape_path: tensors computed from shapes or indices (never quantized).
        precision_paths: node -> why it stays float (on a logarithm's or a tree's path).
        heads: the weighted ops a graph output is read from (empty when the profile has no
            ``head_method``).
        score_maps: graph outputs holding per-element sigmoid scores (idem).
        grouped_convs: grouped Conv -> its activation input.
        position_norm_convs: 1-D Conv before a LayerNormalization -> its activation input.
        reader_bounds: (reader node, input index) -> the input range beyond which the
            reader's output no longer changes; readers without such bounds are absent.
        gated_products: the outputs of gated linear units (a product of two unbounded
            activations, :func:`onnxq.place.paths.gated_products`).
        bodies: the indexes of the control-flow bodies, depth first.
    """

    graph: ir.Graph
    nodes: Mapping[str, onnx.NodeProto]
    shape_path: frozenset[str]
    precision_paths: Mapping[str, str]
    heads: frozenset[str]
    score_maps: tuple[str, ...]
    grouped_convs: Mapping[str, str]
    position_norm_convs: Mapping[str, str]
    reader_bounds: Mapping[tuple[str, int], Bounds]
    gated_products: frozenset[str] = frozenset()
    bodies: tuple[ir.BodyGraph, ...] = ()

    @classmethod
    def of(cls, graph: ir.Graph, profile: BackendProfile) -> GraphFacts:
        """The facts of ``graph`` and the bodies inside it as ``profile`` sees them (its shape
        ops, its head method)."""
        heads = profile.head_method is not None
        scopes = ir.scopes(graph)
        path: set[str] = set()
        for scope in scopes:  # outer scopes first: a body reading a shape is on the path
            path |= shape_path(scope, profile, frozenset(path))
        # an If branch's outputs are the If's: its heads are the model's when the If's are;
        # a Loop's or Scan's outputs are state carried to the next step, not read at extremes
        branches = [s for s in scopes if not isinstance(s, ir.BodyGraph) or _branch(s)]
        return cls(
            graph=graph,
            nodes=_merged(scopes, lambda s: {n.name: n for n in s.nodes}),
            shape_path=frozenset(path),
            precision_paths=_merged(scopes, precision_paths),
            heads=frozenset().union(*map(head_nodes, branches)) if heads else frozenset(),
            score_maps=tuple(score_maps(graph)) if heads else (),
            grouped_convs=_merged(scopes, grouped_conv_inputs),
            position_norm_convs=_merged(scopes, position_norm_convs),
            reader_bounds=_merged(scopes, _reader_bounds),
            gated_products=frozenset().union(*map(gated_products, scopes)),
            bodies=tuple(s for s in scopes if isinstance(s, ir.BodyGraph)),
        )

    def within(self, scope: ir.Graph) -> GraphFacts:
        """These facts with ``scope`` (the top-level graph or one of :attr:`bodies`) as the
        graph the rules walk."""
        return self if scope is self.graph else replace(self, graph=scope)

    def scopes(self) -> tuple[ir.Graph, ...]:
        """The top-level graph, then the bodies."""
        return (self.graph, *self.bodies)

    def saturation_bounds(self, consumers: list[tuple[str, int]]) -> Bounds | None:
        """The (low, high) beyond which none of ``consumers``' outputs change any more, or None.

        Relu is constant below 0, Clip outside its constant bounds, HardSigmoid outside
        ``[-beta/alpha, (1-beta)/alpha]``, HardSwish below -3, and ``x * HardSigmoid(x)`` (the
        hardswish of opsets before 14) below HardSigmoid's lower bound, where the gate is 0.
        A range clipped to the returned bounds gives those readers the same outputs as the
        unclipped one, and finer steps inside: a conv output over [-35, 145] in front of a
        hardswish needs only [-3, 145].  None when a reader has no such bound on both sides."""
        low, high = math.inf, -math.inf
        for reader in consumers:
            bound = self.reader_bounds.get(reader)
            if bound is None:
                return None
            low, high = min(low, bound[0]), max(high, bound[1])
        if not consumers or (low == -math.inf and high == math.inf):
            return None
        return low, high


def _branch(scope: ir.BodyGraph) -> bool:
    """Whether ``scope`` is an If branch inside If branches only (no Loop or Scan around)."""
    return all(b.owner.op_type == "If" for b in scope.body.chain())


def _merged(scopes: list[ir.Graph], facts: Callable[[ir.Graph], Mapping[K, V]]) -> Mapping[K, V]:
    """One read-only mapping of ``facts`` over every scope (names are unique in the model)."""
    out: dict[K, V] = {}
    for scope in scopes:
        out.update(facts(scope))
    return MappingProxyType(out)


def _reader_bounds(graph: ir.Graph) -> dict[tuple[str, int], Bounds]:
    """Every (node, input index) whose reader saturates beyond fixed bounds."""
    found = {}
    for node in graph.nodes:
        for index, tensor in enumerate(node.input):
            if tensor and (bound := _saturates(graph, node, index, tensor)) is not None:
                found[(node.name, index)] = bound
    return found


def _saturates(graph: ir.Graph, node: onnx.NodeProto, index: int, tensor: str) -> Bounds | None:
    """Where one reader of ``tensor`` (at input ``index``) saturates."""
    if node.domain not in ir.DEFAULT_DOMAINS or (index != 0 and node.op_type != "Mul"):
        return None
    if node.op_type in SATURATION_BOUNDS:
        return SATURATION_BOUNDS[node.op_type]
    if node.op_type == "Clip":
        lo, hi = graph.clip_bounds(node)
        return (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
    if node.op_type == "HardSigmoid":
        return _hardsigmoid_bounds(node)
    if node.op_type == "Mul" and len(node.input) == 2:
        gate = graph.producer.get(node.input[1 - index])
        if gate is not None and gate.op_type == "HardSigmoid" and gate.input[:1] == [tensor]:
            bound = _hardsigmoid_bounds(gate)
            return None if bound is None else (bound[0], math.inf)
    return None


def _hardsigmoid_bounds(node: onnx.NodeProto) -> Bounds | None:
    attrs = ir.node_attrs(node)
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    if not alpha > 0:
        return None
    return -beta / alpha, (1.0 - beta) / alpha
