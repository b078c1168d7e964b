"""The vocabulary of placement rules: specs, matches, declines and the rule value itself.

A rule is a value: a name, the op types it anchors on, and ``annotate(match, ctx)`` that returns
the :class:`Spec` list to place on the matched node's tensors, or a :class:`Decline` with the
reason.  Rules never edit the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import onnx

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config import QuantConfig

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


@dataclass
class Context:
    """What rules may read: the profile, the config and facts about the graph.

    ``float_tensors`` / ``float_nodes`` carry decisions made from calibration data (a tensor
    whose range is dominated by mask fill values, a Concat whose inputs' ranges differ too much):
    name -> reason.
    """

    profile: BackendProfile
    config: QuantConfig
    graph: ir.Graph
    shape_path: set[str] = field(default_factory=set)
    claimed: set[str] = field(default_factory=set)
    float_tensors: dict[str, str] = field(default_factory=dict)
    float_nodes: dict[str, str] = field(default_factory=dict)
    quantized: dict[str, str] = field(default_factory=dict)  # tensor -> kind, so far

    @property
    def min_channels(self) -> int:
        """The small-op threshold: the config's, else the profile's."""
        if self.config.min_channels is not None:
            return self.config.min_channels
        return self.profile.min_channels


Annotate = Callable[[Match, Context], "list[Spec] | Decline"]


@dataclass(frozen=True)
class Rule:
    """A placement rule: ``annotate`` runs on nodes whose op type is in ``op_types``."""

    name: str
    op_types: frozenset[str]
    annotate: Annotate
    doc: str = ""


def rule(name: str, *op_types: str, doc: str = "") -> Callable[[Annotate], Rule]:
    """Decorator turning an annotate function into a :class:`Rule` value."""

    def wrap(fn: Annotate) -> Rule:
        return Rule(name, frozenset(op_types), fn, doc or (fn.__doc__ or "").strip())

    return wrap
