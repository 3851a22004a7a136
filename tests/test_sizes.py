"""Size of the package's modules: over 500 lines of code, a module says why.

Lines of code leave out blank lines, comment lines and docstrings. A module is
read in one sitting up to about 500 lines; one that is longer says why in its
opening paragraph, in a sentence starting "Over 500 lines of code:". A class may
be as big as its concept (pyzmq's ``Socket`` is 462 lines of code): what must
not happen is coupling, which tests/test_private_reaches.py and
tests/test_layers.py check, not a size (see docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedmux"
MAX_MODULE_LINES = 500
#: How a module over MAX_MODULE_LINES opens the sentence that says why.
REASON = "Over 500 lines of code:"


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(source: str, first: int = 1, last: int | None = None) -> int:
    """Lines of code of ``source`` between ``first`` and ``last`` (1-based, inclusive)."""
    skip = _docstring_lines(ast.parse(source))
    count = 0
    for number, line in enumerate(source.splitlines(), 1):
        if number < first or (last is not None and number > last) or number in skip:
            continue
        text = line.strip()
        if text and not text.startswith("#"):
            count += 1
    return count


def test_code_lines_leaves_out_docstrings_comments_and_blank_lines() -> None:
    source = '"""Doc."""\n\n# comment\nx = 1\n\nclass A:\n    """Doc\n    more."""\n    y = 2\n'
    assert code_lines(source) == 3
    assert code_lines(source, 6, 9) == 2


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_a_module_over_500_lines_says_why(path: Path) -> None:
    source = path.read_text()
    if code_lines(source) > MAX_MODULE_LINES:
        opening = ast.get_docstring(ast.parse(source)) or ""
        assert REASON in opening, (
            f"{path.name}: {code_lines(source)} lines of code, expected at most "
            f"{MAX_MODULE_LINES} or a sentence {REASON!r} in its opening paragraph")
