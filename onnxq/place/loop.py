"""The placement loop: place, measure, and place again while the data keeps more float.

Data-driven exclusions only remove Q/DQ, but a removal can make another rule choose a
different tensor (a residual Add whose conv stayed float), which then needs statistics too.
So :func:`place` alternates the rule engine with a ``measure`` callable until the exclusions
add nothing.  ``measure`` is the only thing that differs between calibrating from data and
loading a calibration cache (``onnxq.calibrate.measure``); a test drives the loop with a fake one.

``measure(wanted)`` takes the activation tensors the placement quantizes (name -> whether its
method needs a histogram) and returns statistics for each of them, or, in ``unobservable``, the
reason it has none (the data could be read only once, its control-flow body never ran); those
tensors stay float and the loop places again.  ``body_runs`` says how often each If/Loop/Scan
body ran: every op inside a body that never ran (an If branch the data never takes) stays
float with that reason, whatever graph its inputs come from.  The loop never returns a
placement with a quantized tensor it has no statistics for, and does not stop silently: past
``max_rounds`` it raises :class:`InternalError` naming what kept changing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from onnxq import ir
from onnxq.backends.profile import BackendProfile
from onnxq.config.placement import PlacementOptions
from onnxq.errors import InternalError
from onnxq.numerics.observers import HISTOGRAM_METHODS
from onnxq.numerics.tensor_stats import TensorStats
from onnxq.place.annotations import Annotations, Excluded
from onnxq.place.engine import annotate
from onnxq.place.exclusions import Evidence, find_exclusions
from onnxq.place.facts import GraphFacts

# each round keeps at least one more tensor or node float; the zoo models settle in 1 or 2
MAX_ROUNDS = 8


class Statistics(Protocol):
    """What a measure returns: statistics per observed tensor, and the wanted tensors it could
    not observe (tensor -> why)."""

    @property
    def stats(self) -> Mapping[str, TensorStats]: ...

    @property
    def unobservable(self) -> Mapping[str, str]: ...

    @property
    def body_runs(self) -> Mapping[str, int]: ...


S = TypeVar("S", bound=Statistics)


@dataclass(frozen=True)
class Placement(Generic[S]):
    """The settled placement, the statistics of every activation tensor it quantizes, and how
    many rounds it took."""

    annotations: Annotations
    statistics: S
    rounds: int


def observed_tensors(annotations: Annotations, profile: BackendProfile) -> dict[str, bool]:
    """The activation tensors a placement needs statistics for -> whether their range method
    needs a histogram (none under a dynamic profile: its kernels quantize at run time)."""
    if profile.dynamic:
        return {}
    return {
        ann.tensor: ann.method in HISTOGRAM_METHODS for ann in annotations.of_kind("activation")
    }


def place(
    facts: GraphFacts,
    profile: BackendProfile,
    options: PlacementOptions,
    measure: Callable[[Mapping[str, bool]], S],
    max_rounds: int = MAX_ROUNDS,
    kept: Excluded | None = None,
) -> Placement[S]:
    """Place Q/DQ over ``facts.graph`` with the statistics ``measure`` gives, until the
    data-driven exclusions keep nothing more float.  ``kept``: nodes and tensors kept float
    from the start, with their reasons (the accuracy target's choice,
    ``onnxq.mixed.search``)."""
    excluded = kept or Excluded()
    added = Excluded()
    for rounds in range(1, max_rounds + 1):
        annotations = annotate(facts, profile, options, excluded)
        wanted = observed_tensors(annotations, profile)
        measured = measure(wanted)
        missing = sorted(t for t in wanted if t not in measured.stats)
        unobservable = {t: measured.unobservable[t] for t in missing if t in measured.unobservable}
        if len(unobservable) != len(missing):
            lost = [t for t in missing if t not in unobservable]
            raise InternalError(
                f"the measure gave no statistics and no reason for {len(lost)} tensor(s) the "
                f"placement quantizes, e.g. {', '.join(repr(t) for t in lost[:5])}"
            )
        idle = idle_bodies(facts, measured.body_runs)
        if unobservable:
            added = Excluded(tensors=unobservable) | idle
        else:
            added = find_exclusions(annotations, Evidence(measured.stats, facts), options) | idle
            if not added.adds_to(excluded):
                return Placement(annotations, measured, rounds)
        excluded = excluded | added
    raise InternalError(_unsettled(max_rounds, added))


def idle_bodies(facts: GraphFacts, runs: Mapping[str, int]) -> Excluded:
    """Every node inside a control-flow body that never ran on the calibration data (``runs``:
    body key -> runs), with why: there is no data to calibrate it on."""
    nodes: dict[str, str] = {}
    for scope in facts.bodies:
        why = ir.never_ran(scope.body.chain(), runs)
        if why is not None:
            nodes.update((n.name, why) for n in scope.nodes)
    return Excluded(nodes=nodes)


def _unsettled(rounds: int, added: Excluded) -> str:
    """Why the loop gave up: what its last round still kept float."""
    names = [*(repr(t) for t in added.tensors), *(f"node {n!r}" for n in added.nodes)]
    return (
        f"placement did not settle in {rounds} rounds: each round the calibration data kept "
        f"more float, the last {len(names)}: {', '.join(names[:8])}"
        + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    )
