"""A figure, not a gate: how many conditionals of the server test a delivery mode.

The server's delivery is meant to be a chain of stages chosen once, at start
(docs/architecture.md): a mode is a stage present or absent, not a flag asked
along the path. This scan counts what is left of the flags. A conditional is an
``if``/``elif``, a ``while``, a conditional expression, an ``assert`` or a
comprehension's ``if``; it tests a mode when a name or attribute in its test
names one of :data:`MODES` (``reliable``, ``group``, ``rank``, ``shm``/``pool``,
``worker``, ``compress``/``codec``, ``batch``, ``bucket``, ``resume``) or is an
``is None`` test of such an optional feature object. Run the figure with::

    python -m pytest -q -s tests/test_mode_conditionals.py

It prints the total, the modules with the most, and how many test two modes at
once; the issue that asked for the stages quotes it (423 when it was filed).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "feedmux" / "server"
#: The mode a name points at, by the words in it.
MODES = {
    "reliable": re.compile(r"reliab"),
    "groups": re.compile(r"group|fanout"),
    "ranks": re.compile(r"rank|world_size"),
    "shared memory": re.compile(r"shm|pool|shared"),
    "workers": re.compile(r"worker"),
    "compression": re.compile(r"compress|codec"),
    "batches": re.compile(r"batch"),
    "buckets": re.compile(r"bucket"),
    "resume": re.compile(r"resum|cut"),
}


def _names(node: ast.AST) -> list[str]:
    found = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.append(child.id.lower())
        elif isinstance(child, ast.Attribute):
            found.append(child.attr.lower())
    return found


def _tests(tree: ast.AST) -> list[ast.AST]:
    tests: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
    return tests


def modes_tested(test: ast.AST) -> set[str]:
    """The modes a conditional's test names."""
    names = _names(test)
    return {mode for mode, pattern in MODES.items() if any(pattern.search(n) for n in names)}


def scan(paths: list[Path]) -> tuple[Counter[str], int]:
    """Conditionals testing a mode per module, and how many test two modes or more."""
    per_module: Counter[str] = Counter()
    several = 0
    for path in paths:
        for test in _tests(ast.parse(path.read_text())):
            modes = modes_tested(test)
            if modes:
                per_module[str(path.relative_to(SERVER.parent))] += 1
                several += len(modes) > 1
    return per_module, several


def test_the_scan_counts_a_mode_flag_and_not_a_plain_test(tmp_path: Path) -> None:
    module = tmp_path / "sample.py"
    module.write_text("def send(self, message, count):\n"
                      "    if self.reliable and self.group is not None:\n        pass\n"
                      "    if count > 3:\n        pass\n"
                      "    size = 1 if self.batch_size else 0\n")
    assert [modes_tested(test) for test in _tests(ast.parse(module.read_text()))] == [
        {"reliable", "groups"}, set(), {"batches"}]


def test_the_figure_of_mode_conditionals_in_the_server() -> None:
    per_module, several = scan(sorted(SERVER.rglob("*.py")))
    total = sum(per_module.values())
    top = ", ".join(f"{name} {count}" for name, count in per_module.most_common(5))
    print(f"\nconditionals testing a mode in feedmux/server: {total} in {len(per_module)} "
          f"modules ({several} test two modes or more); most: {top}")
    assert total > 0  # the scan read the server (a figure, not a gate)
