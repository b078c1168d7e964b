"""onnxq's modules import each other without a circle (function-level imports included), and its
packages stand in bands that import only downwards: every module can be read, tested and replaced
on top of the ones it imports, and a stage never reaches into a later one.

The bands are the layout of docs/contributing.md (a test holds the two together)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onnxq"
CONTRIBUTING = PACKAGE.parent / "docs" / "contributing.md"

# onnxq's packages (and root modules) from the bottom up: a module may import from its own band
# and the bands below it, never from a band above.  The stages run in this order too, except
# that materialize sits below the stages that build trial models with it (recover, mixed), and
# weightonly, which still wires its own run, above report.
BANDS: tuple[tuple[str, ...], ...] = (
    ("errors", "version"),
    ("ir",),
    ("numerics",),
    ("runtime", "data", "scale"),
    ("backends",),
    ("config",),
    ("prepare",),
    ("place",),
    ("calibrate",),
    ("materialize",),
    ("recover",),
    ("mixed",),
    ("validate",),
    ("report",),
    ("weightonly",),
    ("api",),
    ("onnxq", "cli", "pytorch", "analyze"),
)
MAX_FLOORS = 13  # the longest chain of package imports, counted in packages
MAX_ROOT_MODULES = 12


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
    assert "onnxq.config.sparsebit" in import_graph()["onnxq.config"]


def room(module: str) -> str:
    """The package (or root module) of ``module``: ``onnxq.place.rules.static`` -> ``place``;
    the package itself is ``onnxq``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "onnxq"


def upward_imports(
    graph: dict[str, set[str]], bands: tuple[tuple[str, ...], ...]
) -> list[tuple[str, str]]:
    """The imports from a module to one in a higher band."""
    band = {name: i for i, members in enumerate(bands) for name in members}
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if band[room(target)] > band[room(module)]
    )


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other, else one above the highest room it
    imports (the package graph must have no circle)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets)
    floor: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise AssertionError("package circle: " + " -> ".join([*path, name]))
        if name not in floor:
            below = [visit(t, (*path, name)) for t in sorted(rooms[name] - {name})]
            floor[name] = 1 + max(below, default=0)
        return floor[name]

    for name in sorted(rooms):
        visit(name, ())
    return floor


def test_every_package_has_a_band():
    rooms = {room(m) for m in import_graph()}
    placed = [name for members in BANDS for name in members]
    assert len(placed) == len(set(placed)), "a package in two bands"
    assert rooms == set(placed), (
        f"not in a band: {sorted(rooms - set(placed))}; gone: {sorted(set(placed) - rooms)}"
    )


def test_no_import_points_up_the_bands():
    up = upward_imports(import_graph(), BANDS)
    assert not up, "imports up the bands: " + "; ".join(f"{m} -> {t}" for m, t in up)


def test_the_house_stays_low_and_the_root_small():
    graph = import_graph()
    floor = floors(graph)
    assert max(floor.values()) <= MAX_FLOORS, sorted(floor.items(), key=lambda kv: kv[1])
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_layering_checks_can_fail():
    bands = (("ir",), ("place",))
    graph = {"onnxq.ir.graph": {"onnxq.place.engine"}, "onnxq.place.engine": set()}
    assert upward_imports(graph, bands) == [("onnxq.ir.graph", "onnxq.place.engine")]
    assert upward_imports({"onnxq.place.engine": {"onnxq.ir.graph"}}, bands) == []
    assert floors({"onnxq.a.x": {"onnxq.b.y"}, "onnxq.b.y": {"onnxq.c"}, "onnxq.c": set()}) == {
        "a": 3,
        "b": 2,
        "c": 1,
    }
    try:
        floors({"onnxq.a.x": {"onnxq.b.y"}, "onnxq.b.y": {"onnxq.a.z"}, "onnxq.a.z": set()})
    except AssertionError as e:
        assert "package circle: a -> b -> a" in str(e)
    else:
        raise AssertionError("a package circle went unnoticed")


def test_the_contributors_page_shows_the_bands():
    """docs/contributing.md's layout table lists the bands top down, one row each, its first
    column the band's packages."""
    text = CONTRIBUTING.read_text(encoding="utf-8")
    start = text.index("<!-- bands -->")
    rows = [
        line
        for line in text[start:].splitlines()[1:]
        if line.startswith("|") and not line.startswith("|--") and not line.startswith("| band")
    ]
    rows = rows[: len(BANDS)]
    shown = [tuple(n.strip(" `") for n in row.split("|")[1].split(",")) for row in rows]
    assert shown == list(reversed(BANDS))
