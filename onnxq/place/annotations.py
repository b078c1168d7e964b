"""What placement decides, as data: which tensors get Q/DQ and how (:class:`Annotations`), one
:class:`Decision` per node, and what the calibration data keeps float (:class:`Excluded`).

``materialize`` inserts Q/DQ from the annotations; the report lists the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from onnxq.config.overrides import TensorSettings


@dataclass
class TensorAnnotation:
    """The merged specs of one tensor."""

    tensor: str
    kind: str
    consumers: list[tuple[str, int]]
    axis: int | None = None
    inputs: tuple[str, ...] = ()
    rules: list[str] = field(default_factory=list)
    output: bool = False  # some rule quantizes it as an op's output
    settings: TensorSettings = field(default_factory=lambda: TensorSettings(""))
    # (low, high) beyond which every quantized reader's output stays the same (a HardSwish
    # below -3): the range never needs to pass them (GraphFacts.saturation_bounds)
    bounds: tuple[float, float] | None = None
    # quantized as x - R/2 on the whole symmetric grid, R/2 added back through the readers'
    # biases (onnxq.place.shift; materialize writes it)
    shift: bool = False

    @property
    def method(self) -> str:
        """The activation range method."""
        return self.settings.method


@dataclass(frozen=True)
class Decision:
    """What happened to one node: quantized by ``rule`` (``tensors`` got Q/DQ), or float with
    ``reason`` (``rule``: the closest rule, which declined).  ``shares_scale``: the rule gives
    the node's activation inputs one scale (a Concat), which the data can veto."""

    node: str
    op_type: str
    quantized: bool
    rule: str
    reason: str = ""
    tensors: tuple[str, ...] = ()
    shares_scale: bool = False


@dataclass
class Annotations:
    """Every annotated tensor (in graph order) and a decision per node."""

    tensors: dict[str, TensorAnnotation]
    decisions: list[Decision]
    notes: list[str] = field(default_factory=list)  # model-wide choices, for the report
    # the range method 'auto' meant for every activation because the model's outputs are
    # per-element sigmoid scores (BackendProfile.head_method), or None
    score_map_method: str | None = None

    def of_kind(self, kind: str) -> list[TensorAnnotation]:
        """The annotated tensors of one kind, in graph order."""
        return [t for t in self.tensors.values() if t.kind == kind]


def _frozen(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Excluded:
    """Tensors and nodes the calibration data keeps float: name -> the reason."""

    tensors: Mapping[str, str] = field(default_factory=lambda: _frozen(None))
    nodes: Mapping[str, str] = field(default_factory=lambda: _frozen(None))

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", _frozen(self.tensors))
        object.__setattr__(self, "nodes", _frozen(self.nodes))

    def __or__(self, more: Excluded) -> Excluded:
        """Both; where both name a tensor or node, ``more``'s reason."""
        return Excluded({**self.tensors, **more.tensors}, {**self.nodes, **more.nodes})

    def adds_to(self, known: Excluded) -> bool:
        """True if this names a tensor or node that ``known`` does not."""
        return not (self.tensors.keys() <= known.tensors.keys()) or not (
            self.nodes.keys() <= known.nodes.keys()
        )

    def __bool__(self) -> bool:
        return bool(self.tensors or self.nodes)
