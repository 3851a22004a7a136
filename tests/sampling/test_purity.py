"""The sampling library holds no hook set by serving code.

What a mux does on a stream error is handed to it as an argument at each
activation (``EpochIterator(on_stream_error=...)``), never set from outside as
ambient state, so no module of the package may import ``contextvars``. That it
imports no zmq, server or client is checked for every pure package in
``tests/test_layers.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import feedmux.sampling

MODULES = sorted(Path(feedmux.sampling.__file__).parent.glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_no_module_holds_ambient_hooks(path: Path) -> None:
    assert "contextvars" not in imported_modules(path)


def test_every_module_is_checked() -> None:
    assert {path.name for path in MODULES} >= {"mux.py", "_passes.py", "epochs.py", "streamer.py"}
