"""Check the relative links of the markdown files outside the docs site (README.md and the
examples' READMEs): each must name an existing file, and an ``#anchor`` a heading of it.
``mkdocs build --strict`` checks the links inside docs/.

Usage::

    python scripts/check_links.py [FILE.md ...]     # default: README.md, examples/*/README.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.DOTALL)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[`*]", "", heading).strip().lower()  # `_` stays: toc keeps it (\w)
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s-]+", "-", text).strip("-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (code blocks left out)."""
    text = CODE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE)}


def broken_links(path: Path) -> list[str]:
    """One line per link of ``path`` that leads nowhere."""
    problems = []
    text = CODE.sub("", path.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here (no network)
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            problems.append(f"{path.relative_to(ROOT)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.relative_to(ROOT)}: {target}: no heading #{anchor}")
    return problems


def main(argv: list[str]) -> int:
    """Print the broken links; exit 1 if there are any."""
    files = [Path(a).resolve() for a in argv] or [
        ROOT / "README.md",
        *sorted((ROOT / "examples").glob("*/README.md")),
    ]
    problems = [p for f in files for p in broken_links(f)]
    for line in problems:
        print(line, file=sys.stderr)
    print(f"checked {len(files)} files: {len(problems)} broken links")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
