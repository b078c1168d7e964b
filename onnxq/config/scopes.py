"""Torch module names as ONNX node-name scopes: what the exporters name nodes after, so that a
module name (``features.3.conv``) can select the nodes inside it (``exclude``, overrides,
Sparsebit's ``SKIP_TRACE_MODULES``) without torch installed."""

from __future__ import annotations

import re
from collections.abc import Sequence

from onnxq.errors import ConfigError

_NUMERIC = re.compile(r"[0-9*?\[\]!-]+")  # an index atom, possibly a glob over indices


def module_pattern(name: str) -> str:
    """The node-name glob for every node inside torch module ``name`` (globs allowed).

    The exporter gives each module one scope level: its qualified name from the last
    non-numeric part on, so children of Sequential/ModuleList keep their index.  Module
    ``features.3.conv`` is scope ``/features/features.3/conv``, its Conv node
    ``/features/features.3/conv/Conv``; functional ops sit in the caller's scope
    (``/features/features.3/Add``).  Use the glob in ``exclude`` or ``Override(node=...)``.

    >>> module_pattern("features.3.conv")
    '/features/features.3/conv/*'
    >>> module_pattern("layer*.0")
    '/layer*/layer*.0/*'
    """
    if not name or name.startswith(".") or name.endswith(".") or ".." in name:
        raise ConfigError(f"module_pattern: {name!r} is not a module name like 'features.3.conv'")
    atoms = name.split(".")
    return "/" + "/".join(scope_name(atoms[: k + 1]) for k in range(len(atoms))) + "/*"


def scope_name(atoms: Sequence[str]) -> str:
    """A module's scope name: its qualified name from the last non-numeric atom on."""
    for i in range(len(atoms) - 1, -1, -1):
        if not _NUMERIC.fullmatch(atoms[i]):
            return ".".join(atoms[i:])
    return ".".join(atoms)


def scope_modules(node_name: str) -> tuple[str, ...]:
    """The qualified names of the modules enclosing a TorchScript-exported node, outermost
    first, from its name's scopes: ``/model/layers.0/mlp/up_proj/MatMul`` gives ``model``,
    ``model.layers.0``, ``model.layers.0.mlp``, ``model.layers.0.mlp.up_proj``.

    A Sequential child's scope repeats its parent's (``/features/features.3``); a ModuleList
    child's does not (``/layers.0``: the list is iterated, never called); both give
    ``features.3`` / ``layers.0``.  A name without scopes (no leading ``/``) gives ``()``.
    """
    if not node_name.startswith("/"):
        return ()
    path: list[str] = []
    out: list[str] = []
    for scope in node_name.split("/")[1:-1]:
        atoms = scope.split(".")
        if not scope or any(not a for a in atoms):
            return ()
        for k in range(min(len(path), len(atoms) - 1), 0, -1):
            if path[-k:] == atoms[:k] and all(_NUMERIC.fullmatch(a) for a in atoms[k:]):
                path = path[:-k]  # a Sequential child: its scope starts with its parent's
                break
        path += atoms
        out.append(".".join(path))
    return tuple(out)
