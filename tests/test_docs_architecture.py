"""docs/architecture.md stays true: every module of feedmux/ is named, and the table of
combinations is the one in ``feedmux.server.config``.

The module tables are read from the document: under a heading that names a package
(```feedmux.server._delivery```), each table row whose first cell is a module file
(```dealing.py```) names that module. A module added to feedmux/ without a row, or a row
left behind for a module that is gone, fails here. The combination table is rendered
from :data:`~feedmux.server.config.REFUSED` and :data:`~feedmux.server.config.OFF` and
must appear in the document word for word; the failure prints the block to paste.
"""

from __future__ import annotations

import re
from pathlib import Path

from feedmux.server.config import ASKS, OFF, REFUSED

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "feedmux"
DOC = REPO / "docs" / "architecture.md"

_HEADING = re.compile(r"^#{2,4} `(feedmux(?:\.[\w]+)*)`")
_ROW = re.compile(r"^\| `([\w]+\.py)` \|")


def documented_modules(text: str) -> set[str]:
    """The modules the document's tables name, as paths relative to the repository."""
    named: set[str] = set()
    package: str | None = None
    for line in text.splitlines():
        if heading := _HEADING.match(line):
            package = heading.group(1)
        elif line.startswith("#"):
            package = None
        elif package is not None and (row := _ROW.match(line)):
            named.add("/".join([*package.split("."), row.group(1)]))
    return named


def package_modules() -> set[str]:
    """Every module file of the feedmux package, as paths relative to the repository."""
    return {path.relative_to(REPO).as_posix() for path in PACKAGE.rglob("*.py")}


def combination_table() -> str:
    """The table of combinations of docs/architecture.md, rendered from config.py."""
    lines = ["| asked for | together with | outcome | why |", "|---|---|---|---|"]
    for rules, outcome in ((REFUSED, "refused"), (OFF, "second switched off")):
        for (first, second), reason in rules.items():
            lines.append(f"| {ASKS[first]} | {ASKS[second]} | {outcome} | {reason} |")
    return "\n".join(lines)


def test_the_tables_read_a_row_under_its_package_heading() -> None:
    text = "\n".join([
        "### `feedmux.server._delivery`", "| module | owns |", "|---|---|",
        "| `dealing.py` | the rule |", "## Elsewhere", "| `stray.py` | not a module row |",
        "### `feedmux`", "| `errors.py` | the tree |",
    ])
    assert documented_modules(text) == {"feedmux/server/_delivery/dealing.py",
                                        "feedmux/errors.py"}


def test_every_module_of_feedmux_is_named_in_the_architecture() -> None:
    named = documented_modules(DOC.read_text(encoding="utf-8"))
    missing = sorted(package_modules() - named)
    assert not missing, (
        f"expected a row in docs/architecture.md (under its package's heading) for every "
        f"module of feedmux/, got none for: {missing}")


def test_the_architecture_names_no_module_that_is_gone() -> None:
    named = documented_modules(DOC.read_text(encoding="utf-8"))
    stale = sorted(named - package_modules())
    assert not stale, (f"expected docs/architecture.md to name only modules that exist, "
                       f"got rows for: {stale}")


def test_the_combination_table_is_the_one_in_config() -> None:
    table = combination_table()
    assert table in DOC.read_text(encoding="utf-8"), (
        "expected docs/architecture.md to hold the table of combinations as config.py's "
        f"REFUSED and OFF give it; paste this block in its place:\n{table}")
