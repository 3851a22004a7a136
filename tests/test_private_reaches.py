"""No function of the trainer's side or of the server's sources reads private fields of others.

A function given an object (a module function's parameter, or a method's
parameter other than ``self``) uses that object's public names only: what it
needs of the object's private state is a method of that object or an argument
(docs/architecture.md). The check reads the source of the client package, the
audit log and its checker, the torch bridge, and the server's sources (the
producer, the forwarder and the other modules of ``server/_sources``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedmux"
CHECKED = sorted([*(PACKAGE / "client").glob("*.py"), PACKAGE / "_auditlog.py",
                  PACKAGE / "apps" / "audit.py", PACKAGE / "torch.py",
                  *(PACKAGE / "server" / "_sources").glob("*.py")])

Function = ast.FunctionDef | ast.AsyncFunctionDef


def private_reaches(source: str) -> list[str]:
    """``function: parameter._field`` for every private field a function reads of a parameter
    (``self`` and ``cls`` of a method excepted)."""
    found: list[str] = []

    def visit(function: Function, own: set[str]) -> None:
        arguments = function.args
        given = {a.arg for a in (*arguments.posonlyargs, *arguments.args,
                                 *arguments.kwonlyargs)} - own
        for node in ast.walk(function):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in given and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"{function.name}: {node.value.id}.{node.attr}")

    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            visit(node, set())
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(item, {"self", "cls"})
    return found


def test_private_reaches_finds_a_module_function_reading_a_private_field() -> None:
    source = ("def wait(loader, seconds):\n    loader._connect()\n    return loader.rank\n\n"
              "class A:\n    def same(self, other):\n        return self._x, other._x\n")
    assert private_reaches(source) == ["wait: loader._connect", "same: other._x"]


@pytest.mark.parametrize("path", CHECKED, ids=[str(p.relative_to(PACKAGE)) for p in CHECKED])
def test_no_function_reads_another_objects_private_fields(path: Path) -> None:
    assert private_reaches(path.read_text()) == [], f"{path.name} reaches into private state"
