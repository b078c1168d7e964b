"""The package stays readable: no module over 400 lines, at most 5 functions over 60 lines
(docs/contributing.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onnxq"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 5


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """The functions (and methods) of ``source`` longer than ``limit`` lines, with their
    lengths."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_module_is_over_400_lines():
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not big, f"split these modules: {big}"


def test_at_most_five_functions_over_60_lines():
    found = [
        (str(p.relative_to(PACKAGE)), name, n)
        for p in sorted(PACKAGE.rglob("*.py"))
        for name, n in long_functions(p.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    ]
    assert len(found) <= MAX_LONG_FUNCTIONS, found


def test_long_functions_are_found():
    body = "\n".join(f"    x = {i}" for i in range(61))
    source = f"def short():\n    return 1\n\n\ndef long():\n{body}\n"
    assert long_functions(source, 60) == [("long", 62)]
