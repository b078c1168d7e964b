"""What the report needs of a feature's record: the :class:`Section` protocol.

A feature that adds a part to the report (accuracy recovery, bias correction, the accuracy
target's search, the weight-only layers) returns a frozen record, defined next to the feature,
that says its part of the JSON report and its lines of the summary.  The report composes the
records in the order it is given them and never imports the features to format them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Section(Protocol):
    """A feature's part of the report."""

    def to_dict(self) -> dict[str, Any]:
        """The entries this record adds to the JSON report (key -> JSON-ready value); an empty
        dict adds none."""
        ...

    def summary_lines(self) -> list[str]:
        """Its lines of the report's summary, in order (none: it has nothing to say)."""
        ...


class Body(Section, Protocol):
    """A record that is the quantized part of a run that does not place Q/DQ op by op (the
    weight-only run): the report shows it instead of the ops, their tensors and reasons."""

    @property
    def mode(self) -> str:
        """The run's kind, written as the JSON report's ``mode`` ("weight-only")."""
        ...

    @property
    def layers(self) -> Sequence[Any]:
        """The layers it quantized, each a record."""
        ...

    @property
    def skipped(self) -> Sequence[tuple[str, str, str]]:
        """The weighted ops it left float: (node, op type, reason)."""
        ...

    def figures(self) -> dict[str, int]:
        """Its counts for the JSON report's ``summary``, first there."""
        ...

    def headline(self) -> str:
        """What the summary's first line says of it, after the backend and the mode."""
        ...

    def html(self) -> str:
        """Its part of the HTML page (a heading and a table; see :mod:`onnxq.report.page`)."""
        ...
