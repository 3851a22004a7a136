"""Size limits of the package: no module over 500 lines of code, no class over 250.

Lines of code leave out blank lines, comment lines and docstrings. The limits keep
every module readable in one sitting (see docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedmux"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250


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
def test_module_and_class_sizes(path: Path) -> None:
    source = path.read_text()
    assert code_lines(source) <= MAX_MODULE_LINES, f"{path.name}: over {MAX_MODULE_LINES} lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            lines = code_lines(source, node.lineno, node.end_lineno)
            assert lines <= MAX_CLASS_LINES, f"class {node.name}: {lines} lines of code"
