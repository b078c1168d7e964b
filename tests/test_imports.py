"""onnxq's modules import each other without a circle (function-level imports included): every
module can be read, tested and replaced on top of the ones it imports."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onnxq"


def _modules() -> dict[str, Path | None]:
    """Module name -> its source (None: a compiled extension, known by its C source)."""
    modules: dict[str, Path | None] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in PACKAGE.rglob("*.c"):
        modules[".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)] = None
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path | None]) -> set[str]:
    """The onnxq modules that module ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from onnxq import ir` imports the module onnxq.ir; `from onnxq.x import f`, onnxq.x
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every onnxq module -> the onnxq modules it imports."""
    modules = _modules()
    return {
        name: _imports(name, path, modules) if path is not None else set()
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_onnxq_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 40 and "onnxq.api" in graph["onnxq"]  # the walk sees the package
    circles = cycles(graph)
    assert not circles, "import circles: " + "; ".join(
        " ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in circles
    )


def test_the_check_finds_a_circle_and_function_level_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # config reads sparsebit inside a function (from_yaml): the edge counts
    assert "onnxq.sparsebit" in import_graph()["onnxq.config"]
