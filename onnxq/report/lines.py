"""The report summary's lines that every run shares: the fidelity of each output (in full
for a Q/DQ run, in short for a weight-only one), onnxruntime's default session, and the float
ops' reasons grouped line by line."""

from __future__ import annotations

import re

from onnxq.backends.default_session import DefaultSessionView
from onnxq.backends.validate import OutputFidelity
from onnxq.place.annotations import Decision
from onnxq.report.fidelity import latency_warning


def fidelity_lines(fidelity: list[OutputFidelity], mode: str) -> list[str]:
    """One line per output: how it was compared and how close it came (``mode``: how the
    outputs were run, e.g. onnxruntime with Q/DQ fusion off)."""
    lines: list[str] = []
    for f in fidelity:
        if f.selected_by:
            lines.append(
                f"fidelity {f.name}: rows selected by {f.selected_by}, compared "
                "by position (other detections or another order count as "
                "differences): " + f.difference()
            )
        elif f.compared == "cosine":
            top1 = (
                "" if f.top1_agreement is None else f", top-1 agreement {f.top1_agreement:.2%}"
            ) + (
                ""
                if f.threshold_agreement is None
                else f", {f.threshold_agreement:.2%} on the same side of {f.threshold:g}"
            )
            worst = (
                ""
                if f.worst_slice_cosine is None
                else f", worst of {f.slices} slices along axis {f.slice_axis}: cosine "
                f"{f.worst_slice_cosine:.6f} (index {f.worst_slice})"
            )
            padded = (
                ""
                if not f.padding_left_out
                else f", {f.padding_left_out} padded positions (mask 0) left out"
            )
            # shown when a few samples dominate the whole cosine
            per_sample = (
                ""
                if f.sample_cosine_mean is None or f.sample_cosine_mean >= f.cosine - 0.01
                else f", per sample {f.sample_cosine_mean:.6f} on average (worst "
                f"{f.worst_sample_cosine:.6f}"
                + (
                    f", held samples {', '.join(map(str, f.worst_samples))}"
                    if f.worst_samples
                    else ""
                )
                + ")"
            )
            lines.append(
                f"fidelity {f.name} ({mode}): cosine {f.cosine:.6f}, "
                f"max abs error {f.max_abs_error:.4g} (float range "
                f"{f.float_max_abs:.4g}){top1}{worst}{padded}{per_sample}"
            )
        elif f.compared == "agreement":
            lines.append(
                f"fidelity {f.name} ({mode}): equal to the float "
                f"model's in {f.cosine:.1%} of its values on the held batches"
            )
        else:
            lines.append(f"fidelity {f.name}: {f.compared}")
    return lines


def brief_fidelity_lines(fidelity: list[OutputFidelity]) -> list[str]:
    """One short line per output: its cosine, error and top-1 agreement."""
    lines: list[str] = []
    for f in fidelity:
        if f.compared == "cosine":
            lines.append(
                f"fidelity {f.name}: cosine {f.cosine:.6f}, max abs error "
                f"{f.max_abs_error:.4g} (float range {f.float_max_abs:.4g})"
                + ("" if f.top1_agreement is None else f", top-1 agreement {f.top1_agreement:.2%}")
            )
        else:
            lines.append(f"fidelity {f.name}: {f.compared}")
    return lines


def default_session_lines(view: DefaultSessionView, timing: bool) -> list[str]:
    """The default session's figures that differ beyond noise and, with ``timing``, its latency
    (and the warning when it is slower than float: said here, once, not in the report file)."""
    lines = [
        f"fidelity {o.name} (onnxruntime's default session on this {view.cpu} machine, "
        f"Q/DQ fused): {o.compared} {o.fused:.6f}, against {o.unfused:.6f} unfused"
        for o in view.outputs
        if o.beyond_noise
    ]
    if timing and view.latency is not None:
        lines.append(
            f"latency in onnxruntime's default session on this {view.cpu} machine (one "
            f"thread, median of {view.latency.pairs}): {view.latency.quantized_ms:.3g} ms, "
            f"float {view.latency.float_ms:.3g} ms"
        )
        slower = latency_warning(view.cpu, view.latency)
        if slower is not None:
            lines.append(f"warning: {slower}")
    return lines


_QUOTED = re.compile(r"'[^']*'")
NAME_LIMIT = 60  # a quoted name longer than this is shown by its start and its end


def reason_lines(float_ops: list[Decision]) -> dict[str, int]:
    """One line per op type and reason -> its count.  Reasons that differ only in the names
    they quote (a tensor, a node) share a line, which shows the first op's names and says how
    many more there are: a line per op would bury the reasons."""
    groups: dict[str, list[str]] = {}
    for d in float_ops:
        generic = _QUOTED.sub("''", d.reason)
        groups.setdefault(f"{d.op_type}: {generic}", []).append(d.reason)
    lines: dict[str, int] = {}
    for key, texts in groups.items():
        op_type = key.split(":", 1)[0]
        line = f"{op_type}: {_QUOTED.sub(_short_name, texts[0])}"
        others = len(texts) - 1
        if len(set(texts)) > 1:
            line += f" (and {others} more with other names)"
        lines[line] = len(texts)
    return lines


def _short_name(quoted: re.Match[str]) -> str:
    """A quoted name, shortened past :data:`NAME_LIMIT` to its start and its end (the end of
    an exported name, ``.../MatMul_output_0``, is its most specific part)."""
    name = quoted.group(0)[1:-1]
    if len(name) <= NAME_LIMIT:
        return quoted.group(0)
    return f"'{name[:24]}…{name[-(NAME_LIMIT - 25) :]}'"
