"""The sampling library is pure: none of its modules imports zmq, the server or the client.

Nor ``contextvars``: what a mux does on a stream error is handed to it as an
argument, never set from outside as ambient state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import feedmux.sampling

FORBIDDEN = ("zmq", "feedmux.server", "feedmux.client", "contextvars")
MODULES = sorted(Path(feedmux.sampling.__file__).parent.glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_no_module_imports_sockets_server_client_or_ambient_hooks(path: Path) -> None:
    forbidden = sorted(
        name for name in imported_modules(path)
        if any(name == root or name.startswith(root + ".") for root in FORBIDDEN)
    )
    assert not forbidden, f"{path.name} imports {forbidden}"


def test_every_module_is_checked() -> None:
    assert {path.name for path in MODULES} >= {"mux.py", "_passes.py", "epochs.py", "streamer.py"}
