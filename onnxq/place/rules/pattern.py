"""The vocabulary of placement rules: specs, claims, matches, declines and the rule value itself.

A rule is a value: a name, the op types it anchors on, and ``annotate(match, ctx)``, a pure
function that returns a :class:`Claim` (the :class:`Spec` list to place on the matched node's
tensors, and any other node it folds in) or a :class:`Decline` with the reason.  Rules read
the graph and the placement so far through :class:`Context` and change neither: the engine
(:mod:`onnxq.place.engine`) applies a claim only when it does not clash with earlier ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.placement import PlacementOptions
from onnxq.place.facts import GraphFacts

Kind = Literal["activation", "weight", "bias", "shared"]


@dataclass(frozen=True)
class Spec:
    """Quantize ``tensor`` where ``consumers`` (node name, input index) read it.

    ``kind`` says how: activation (per-tensor, calibrated), weight (per-channel along ``axis``
    when given, from the constant's own values), bias (int32, scale = scale of ``inputs[0]``
    x scale of ``inputs[1]``) or shared (the qparams of ``inputs[0]``: the output of an op that
    only moves values, so onnxruntime can drop the Q/DQ pair around it).
    """

    tensor: str
    kind: Kind
    consumers: tuple[tuple[str, int], ...]
    axis: int | None = None
    inputs: tuple[str, ...] = ()
    output: bool = False  # the Q/DQ sits on the op's output (requantization), not its input


@dataclass(frozen=True)
class Claim:
    """What a rule takes for the node it matched: the specs to place, and the other nodes
    ``folded`` into the node's quantization (a ReLU whose output carries the conv's Q/DQ);
    ``folded_into`` says into what of the node (their decisions name it)."""

    specs: tuple[Spec, ...] = ()
    folded: tuple[str, ...] = ()
    folded_into: str = "output quantization"

    def __add__(self, other: Claim) -> Claim:
        return Claim(self.specs + other.specs, self.folded + other.folded, self.folded_into)

    def __bool__(self) -> bool:
        return bool(self.specs)


def claim(*specs: Spec) -> Claim:
    """A claim of ``specs`` that folds in no other node."""
    return Claim(specs)


@dataclass(frozen=True)
class Decline:
    """A rule's reason for leaving a node float."""

    reason: str


@dataclass(frozen=True)
class Match:
    """A node a rule anchored on, with the graph around it."""

    node: onnx.NodeProto
    graph: ir.Graph

    @property
    def name(self) -> str:
        """The matched node's name."""
        return self.node.name

    def input(self, index: int) -> str:
        """The node's input ``index`` ("" when absent)."""
        return self.node.input[index] if index < len(self.node.input) else ""

    def attrs(self) -> dict[str, object]:
        """The node's attributes as Python values."""
        return ir.node_attrs(self.node)


@dataclass(frozen=True)
class Context:
    """What rules may read: the profile, the options, the graph facts, what the calibration
    data keeps float (``float_tensors`` / ``float_nodes``: name -> reason; nodes on a
    logarithm's path too), and the placement so far: ``claimed`` nodes and ``quantized``
    tensors (tensor -> kind).  The last two are the engine's, seen read-only.
    """

    profile: BackendProfile
    options: PlacementOptions
    facts: GraphFacts
    float_tensors: Mapping[str, str]
    float_nodes: Mapping[str, str]
    claimed: AbstractSet[str]
    quantized: Mapping[str, str]

    @property
    def graph(self) -> ir.Graph:
        """The graph being placed."""
        return self.facts.graph

    @property
    def shape_path(self) -> frozenset[str]:
        """Tensors computed from shapes or indices."""
        return self.facts.shape_path

    @property
    def min_channels(self) -> int:
        """The small-op threshold: the options', else the profile's."""
        if self.options.min_channels is not None:
            return self.options.min_channels
        return self.profile.min_channels


Annotate = Callable[[Match, Context], "Claim | Decline"]


@dataclass(frozen=True)
class Rule:
    """A placement rule: ``annotate`` runs on nodes whose op type is in ``op_types`` or in
    ``profile_ops(profile)`` (an op list the backend profile holds, such as its unary integer
    kernels).  ``shares_scale``: the rule gives the node's activation inputs one scale, which
    the calibration data can veto (:mod:`onnxq.place.exclusions`)."""

    name: str
    op_types: frozenset[str]
    annotate: Annotate
    doc: str = ""
    shares_scale: bool = False
    profile_ops: Callable[[BackendProfile], frozenset[str]] | None = None

    def anchors(self, profile: BackendProfile) -> frozenset[str]:
        """The op types this rule runs on under ``profile``."""
        extra = self.profile_ops(profile) if self.profile_ops is not None else frozenset()
        return self.op_types | extra


def rule(
    name: str,
    *op_types: str,
    doc: str = "",
    shares_scale: bool = False,
    profile_ops: Callable[[BackendProfile], frozenset[str]] | None = None,
) -> Callable[[Annotate], Rule]:
    """Decorator turning an annotate function into a :class:`Rule` value."""

    def wrap(fn: Annotate) -> Rule:
        return Rule(
            name,
            frozenset(op_types),
            fn,
            doc or (fn.__doc__ or "").strip(),
            shares_scale,
            profile_ops,
        )

    return wrap
