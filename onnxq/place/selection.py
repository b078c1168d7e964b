"""What the user keeps float beyond node-name globs: an ``exclude`` pattern that names a tensor
(its producer stays float: ``onnxq analyze`` lists tensors), op types (``exclude_op_types``)
and exporter modules (``exclude_modules``: globs over the module path the exporter wrote into
each node's metadata, or over the node-name scopes of the TorchScript exporter).

Each selection resolves to ``{node: reason}`` over every node of the graph and its control-flow
bodies; placement keeps those nodes float with that reason (``onnxq.place.engine.annotate``).
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from onnxq.config.placement import PlacementOptions
from onnxq.config.scopes import module_pattern, scope_modules
from onnxq.errors import ConfigError

# node metadata keys that carry the module path: torch.onnx's dynamo exporter writes a list of
# qualified module names under the first and "name: class/name: class" under the second
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
NAMESPACE = "namespace"


@dataclass(frozen=True)
class Selection:
    """The nodes the user's selections keep float, with reasons, and what to tell the user."""

    nodes: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def node_modules(node: onnx.NodeProto) -> tuple[str, ...]:
    """The qualified module names enclosing ``node``, outermost first, from its metadata
    (empty when the exporter wrote none)."""
    meta = {p.key: p.value for p in node.metadata_props}
    if NAME_SCOPES in meta:
        try:
            scopes = ast.literal_eval(meta[NAME_SCOPES])
        except (ValueError, SyntaxError):
            scopes = []
        if isinstance(scopes, list):
            return tuple(str(s) for s in scopes if s)
    if NAMESPACE in meta:
        parts = (part.split(": ", 1)[0].strip() for part in meta[NAMESPACE].split("/"))
        return tuple(p for p in parts if p)
    return ()


def select(nodes: Iterable[onnx.NodeProto], options: PlacementOptions) -> Selection:
    """Resolve the tensor, op-type and module selections of ``options`` over ``nodes``."""
    nodes = list(nodes)
    out: dict[str, str] = {}
    notes: list[str] = []
    names = [n.name for n in nodes]
    for pattern in options.exclude:
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            continue  # a node-name glob: node_excluded keeps those float
        producers = _producers_of(nodes, pattern)
        for tensor, node in producers:
            out.setdefault(
                node.name,
                f"excluded by --exclude {pattern} (tensor {tensor!r}, which this node produces)",
            )
        if producers:
            shown = ", ".join(f"{t!r} -> node {n.name!r} ({n.op_type})" for t, n in producers[:5])
            more = f" and {len(producers) - 5} more" if len(producers) > 5 else ""
            notes.append(
                f"--exclude {pattern} names no node but tensor(s): their producers stay "
                f"float ({shown}{more})"
            )
    for node in nodes:
        for pattern in options.exclude_op_types:
            if fnmatch.fnmatchcase(node.op_type, pattern):
                out.setdefault(node.name, f"excluded by --exclude-op-type {pattern}")
        for pattern in options.exclude_modules:
            module = _in_module(node, pattern)
            if module is not None:
                out.setdefault(
                    node.name, f"excluded by --exclude-module {pattern} (module {module})"
                )
    notes += [
        f"{what} matches no node of the model (after simplification): it changes nothing"
        for what in unmatched_selections(nodes, options)
    ]
    return Selection(out, notes)


def _producers_of(nodes: list[onnx.NodeProto], pattern: str) -> list[tuple[str, onnx.NodeProto]]:
    return [
        (out, node)
        for node in nodes
        for out in node.output
        if out and fnmatch.fnmatchcase(out, pattern)
    ]


def _in_module(node: onnx.NodeProto, pattern: str) -> str | None:
    """The module of ``node`` that ``pattern`` matches (metadata first, else node-name
    scopes), or None."""
    modules = node_modules(node)
    for module in modules:
        if fnmatch.fnmatchcase(module, pattern):
            return module
    if modules:
        return None
    for module in scope_modules(node.name):  # a TorchScript export: the node-name scopes
        if fnmatch.fnmatchcase(module, pattern):
            return module
    try:
        glob = module_pattern(pattern)
    except ConfigError:
        return None
    return pattern if fnmatch.fnmatchcase(node.name, glob) else None


def unmatched_selections(nodes: Iterable[onnx.NodeProto], options: PlacementOptions) -> list[str]:
    """The op-type and module selections that match no node (a typo)."""
    nodes = list(nodes)
    out = [
        f"--exclude-op-type {p!r}"
        for p in options.exclude_op_types
        if not any(fnmatch.fnmatchcase(n.op_type, p) for n in nodes)
    ]
    out += [
        f"--exclude-module {p!r}"
        for p in options.exclude_modules
        if not any(_in_module(n, p) is not None for n in nodes)
    ]
    return out
