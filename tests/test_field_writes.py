"""No module function of feedmux writes another object's fields.

A module function that takes an object and assigns its fields (``core.phase =
...`` in a function beside ``ControlCore``) is a method in hiding: the state and
the code that changes it live apart, and a reader of the class cannot see every
way its fields move. So an object's fields are assigned by its own methods;
a module function may assign the fields of an object it made itself (a socket
it opened and sets options on, a report it built), never those of an object it
was given or looked up.

The rule, read with ast over every module function of feedmux/ (nested
functions included): an assignment ``x.field = ...`` (or ``+=``) is refused
when ``x`` is a parameter, or a local bound to an expression of a parameter
(``trainer = core.trainers[identity]``, ``trainer = core.trainers.get(identity)``,
``for trainer in core.trainers.values()``). A local bound to what a call returns
(a constructor, a factory: ``socket = context.socket(zmq.DEALER)``) is the
function's own. Mutating a field's value through its own methods
(``report.notes.append``) is not an assignment and not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "feedmux"
#: A call that looks an existing object up rather than making one.
LOOKUPS = {"get", "pop", "setdefault", "popitem"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _parameters(function: Function) -> set[str]:
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [extra for extra in (arguments.vararg, arguments.kwarg) if extra is not None]
    return {argument.arg for argument in every}


def _names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


def _makes(value: ast.expr) -> bool:
    """Whether ``value`` is a call that returns an object of the caller's own."""
    if not isinstance(value, ast.Call):
        return False
    return not (isinstance(value.func, ast.Attribute) and value.func.attr in LOOKUPS)


def _bound_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _bound_names(element)]
    return []


def _given(function: Function) -> set[str]:
    """The parameters, and the locals bound to an expression of them, to a fixed point."""
    given = _parameters(function)
    while True:
        more: set[str] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and not _makes(node.value):
                if _names(node.value) & given:
                    more.update(n for t in node.targets for n in _bound_names(t))
            elif isinstance(node, (ast.For, ast.comprehension)) and _names(node.iter) & given:
                more.update(_bound_names(node.target))
        if more <= given:
            return given
        given |= more


def _base(target: ast.expr) -> str | None:
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def field_writes(function: Function) -> list[str]:
    """``line: target`` of every write of a given object's field in ``function``."""
    given = _given(function)
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store)
                        and _base(part) in given):
                    found.append(f"{node.lineno}: {ast.unparse(part)}")
    return found


def module_functions(tree: ast.Module) -> list[Function]:
    """Functions outside any class, nested ones included."""
    found: list[Function] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_function_writes_another_objects_fields(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    writes = [f"{path.relative_to(PACKAGE.parent)}:{write} in {function.name}()"
              for function in module_functions(tree) for write in field_writes(function)]
    assert writes == [], "a module function writes a field of an object it was given"


def test_the_reader_finds_parameters_their_lookups_and_spares_what_a_function_made() -> None:
    tree = ast.parse(
        "def restart(core, message):\n"
        "    core.phase = 1\n"
        "    trainer = core.trainers.get(message.id)\n"
        "    trainer.seen += 1\n"
        "    for other in core.trainers.values():\n"
        "        other.probed = 0\n"
        "    report = Report()\n"
        "    report.count = 3\n"
        "    sock = core.context.socket(1)\n"
        "    sock.linger = 0\n"
        "    core.notes.append(1)\n"
        "class Core:\n"
        "    def set(self, other):\n"
        "        other.phase = 2\n")
    (function,) = module_functions(tree)
    assert field_writes(function) == ["2: core.phase", "4: trainer.seen", "6: other.probed"]
