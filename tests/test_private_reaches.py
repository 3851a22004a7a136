"""No code of feedmux reads or calls another class's private attributes, or imports another
module's private names.

Python's privacy is the module's: a name with one leading underscore belongs to
the module whose classes define it. So a function may use ``x._name`` only when
``_name`` is its own (``self``/``cls``), a name that a class of its own module
defines (a method, or a field it assigns on ``self``), or a private name of an
imported module (the standard library's ``os._exit``, ``sys._getframe``). Any
other ``x._name`` reaches into a class defined elsewhere: what a caller needs of
another object's state is a public method of that object or an argument
(docs/architecture.md). Parameters and locals are both checked; a copy a method
makes of its own object (``object.__new__(type(self))``) is its own.

Two exceptions, each named here with its reason:

- ``_replace``, ``_asdict``, ``_fields``, ``_make``: a named tuple's public API;
- ``feedmux/server/_sources/globalstate.py`` reads numpy's C layout on purpose
  (its opening paragraph says why and how every byte is checked first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedmux"
CHECKED = sorted(PACKAGE.rglob("*.py"))
#: Files allowed to read another library's private state, with the reason in their paragraph.
EXEMPT = {PACKAGE / "server" / "_sources" / "globalstate.py"}
#: Names with a leading underscore that are a public API (``collections.namedtuple``'s).
PUBLIC = {"_replace", "_asdict", "_fields", "_make"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _defined_by(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: its methods, class attributes and the fields it sets."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _copies_of_self(function: ast.AST) -> set[str]:
    """Locals made as instances of the method's own class (``object.__new__(type(self))``,
    ``type(self)(...)``): a copy's private fields are the class's own."""
    names: set[str] = set()
    for node in ast.walk(function):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is None or not any(
                isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "type" and [ast.unparse(a) for a in call.args] == ["self"]
                for call in ast.walk(value)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def private_reaches(source: str) -> list[str]:
    """``line function: object._name`` for every private name used that is not the module's own."""
    tree = ast.parse(source)
    modules = _imported(tree)
    own = set().union(*(_defined_by(node) for node in ast.walk(tree)
                        if isinstance(node, ast.ClassDef)))
    found: list[str] = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        copies = _copies_of_self(function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ({"self", "cls"} | modules | copies):
                continue
            if node.attr in own or node.attr in PUBLIC:
                continue
            found.append(f"{node.lineno} {function.name}: {ast.unparse(base)}.{node.attr}")
    return sorted(set(found), key=lambda line: int(line.split()[0]))


def test_private_reaches_finds_a_reach_through_a_parameter_and_a_local() -> None:
    source = ("import os\n\n"
              "def wait(loader, seconds):\n    loader._connect()\n    os._exit(0)\n"
              "    return loader.rank\n\n"
              "def pick(make):\n    mux = make()\n    return mux._shard(0, 1)\n\n"
              "class A:\n    def __init__(self):\n        self._x = 1\n\n"
              "    def same(self, other):\n        return self._x, other._x, other._y\n")
    assert private_reaches(source) == ["4 wait: loader._connect", "10 pick: mux._shard",
                                       "17 same: other._y"]


@pytest.mark.parametrize("path", CHECKED, ids=[str(p.relative_to(PACKAGE)) for p in CHECKED])
def test_no_function_reads_another_classs_private_attributes(path: Path) -> None:
    if path in EXEMPT:
        pytest.skip("reads numpy's C layout on purpose (its opening paragraph says why)")
    assert private_reaches(path.read_text()) == [], f"{path.name} reaches into private state"


def private_imports(source: str) -> list[str]:
    """``line module._name`` for every private name imported from another feedmux module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("feedmux"):
            found += [f"{node.lineno} {node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_private_imports_finds_a_private_name_of_another_feedmux_module() -> None:
    source = ("from os import _exit\n"
              "from feedmux.server._sources.producer import Frames, _Draw\n"
              "from feedmux._plumbing import shm\n")
    assert private_imports(source) == ["2 feedmux.server._sources.producer._Draw"]


@pytest.mark.parametrize("path", CHECKED, ids=[str(p.relative_to(PACKAGE)) for p in CHECKED])
def test_no_module_imports_another_modules_private_names(path: Path) -> None:
    """What one module of feedmux uses of another is that module's public name: a private
    one is the module's own (the rule above, for names imported rather than reached)."""
    assert private_imports(path.read_text()) == [], f"{path.name} imports private names"
