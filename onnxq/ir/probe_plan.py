"""What a probe plan says: which top-level outputs carry each value of a control-flow body, how
to read the value back at every run of its body, and how often each body ran
(:func:`onnxq.ir.probes.with_probes` makes the plan)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxq.ir.bodies import Body


@dataclass(frozen=True)
class Probe:
    """The top-level outputs that carry one body value: ``(value,)``, or ``(values, shapes)``
    once a Loop collected it; ``lead``: the Scan iteration axes in front of each value."""

    outputs: tuple[str, ...]
    lead: int = 0

    def values(self, outs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The value at every run of its body (empty runs left out), each with the Scan
        iteration axes folded into its first axis."""
        if len(self.outputs) == 1:
            arrays = [np.asarray(outs[self.outputs[0]])]
        else:
            arrays = _split(np.asarray(outs[self.outputs[0]]), np.asarray(outs[self.outputs[1]]))
        out = []
        for a in arrays:
            if a.size == 0:
                continue
            if self.lead:
                a = a.reshape(-1, *a.shape[self.lead + 1 :]) if a.ndim > self.lead else a.ravel()
            out.append(a)
        return out


def _split(values: np.ndarray, shapes: np.ndarray) -> list[np.ndarray]:
    """A Loop's collected values, one array per iteration (``shapes``: ``[rank, dims...]``)."""
    out, at, offset = [], 0, 0
    flat, entries = values.ravel(), shapes.ravel().astype(np.int64)
    while at < entries.size:
        rank = int(entries[at])
        dims = tuple(int(d) for d in entries[at + 1 : at + 1 + rank])
        at += 1 + rank
        size = math.prod(dims)
        out.append(flat[offset : offset + size].reshape(dims))
        offset += size
    return out


@dataclass
class ProbePlan:
    """What :func:`with_probes` threaded out: a probe per observed value and per body (its run
    marker; a body under an If or Loop inside a Scan has none), the bodies around each value,
    the values it could not thread out (value -> why), and the top-level outputs it added."""

    probes: dict[str, Probe] = field(default_factory=dict)
    markers: dict[str, Probe] = field(default_factory=dict)  # body key -> its run marker
    chains: dict[str, tuple[Body, ...]] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)

    def runs(self, outs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """How often each body ran on one batch (body key -> runs)."""
        return {key: sum(v.size for v in p.values(outs)) for key, p in self.markers.items()}

    def never_ran(self, tensor: str, runs: Mapping[str, int]) -> str | None:
        """Why ``tensor`` has no value on the calibration data, given each body's total
        ``runs``: the outermost body around it that never ran; None if all ran."""
        return never_ran(self.chains.get(tensor, ()), runs)

    def conditions(self, tensor: str) -> tuple[tuple[str, str], ...]:
        """The bodies around ``tensor``, outermost first, as (body key, why the tensor has no
        value when that body never ran): plain data, for :func:`unrun` elsewhere."""
        return run_conditions(self.chains.get(tensor, ()))


def run_conditions(chain: Sequence[Body]) -> tuple[tuple[str, str], ...]:
    """(body key, why a value inside it has none if it never ran) for each body of ``chain``."""
    out = []
    for body in chain:
        if body.owner.op_type == "If":
            why = f"branch never taken on the calibration data ({body.label})"
        else:
            why = f"body never run on the calibration data ({body.label}: no iteration)"
        out.append((body.key, why))
    return tuple(out)


def unrun(conditions: Sequence[tuple[str, str]], runs: Mapping[str, int]) -> str | None:
    """Why a value has none, given the ``conditions`` of its bodies (:func:`run_conditions`)
    and each body's total ``runs``: the outermost body whose ``runs`` are 0 (a body missing
    from ``runs`` was not counted and is taken to have run); None if all ran."""
    return next((why for key, why in conditions if runs.get(key, 1) == 0), None)


def never_ran(chain: Sequence[Body], runs: Mapping[str, int]) -> str | None:
    """Why the innermost body of ``chain`` (outermost first) never ran on the calibration data
    (:func:`unrun`); None if all ran."""
    return unrun(run_conditions(chain), runs)
