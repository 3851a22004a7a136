"""Argument checks survive ``python -O``, and the stream modules stay pure."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import feedmux.client

CLIENT = Path(feedmux.client.__file__).resolve().parent
STREAM_MODULES = sorted([CLIENT / "stream.py", *CLIENT.glob("_stream*.py")])

CHECKS = textwrap.dedent(
    """
    import sys
    from feedmux.client import ManualStream, Stream
    from feedmux.errors import StreamStateError, StreamTypeError, StreamValueError

    if sys.flags.optimize < 1:
        raise SystemExit("not running under -O")

    def expect(error, call, *args, **kwargs):
        try:
            call(*args, **kwargs)
        except error:
            return
        raise SystemExit(f"{call.__qualname__}{args}{kwargs} did not raise {error.__name__}")

    stream = Stream(range(3))
    expect(StreamStateError, Stream, [])
    expect(StreamStateError, stream.set_loader, range(0))
    expect(StreamTypeError, Stream, 5)
    expect(StreamStateError, stream.increment_epoch, 1.5)
    expect(StreamStateError, stream.data, 2.0)
    expect(StreamTypeError, stream.data, "2")
    expect(StreamValueError, Stream(iter([1])).data)
    expect(StreamStateError, stream.epochs, 0.5)
    expect(StreamValueError, stream.load_state_dict, {"class": "Stream"})
    expect(StreamStateError, ManualStream(range(3)).data)
    expect(StreamStateError, ManualStream(range(3)).data, n_iterations=1, n_msteps=1)
    print("checks fired")
    """
)


def test_checks_fire_under_python_dash_o() -> None:
    root = CLIENT.parents[1]
    result = subprocess.run(
        [sys.executable, "-O", "-c", CHECKS],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "checks fired"


@pytest.mark.parametrize("path", STREAM_MODULES, ids=lambda path: path.name)
def test_no_assert_statements(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert asserts == [], f"{path.name} validates with assert at lines {asserts}"


@pytest.mark.parametrize("path", STREAM_MODULES, ids=lambda path: path.name)
def test_stream_modules_import_only_the_standard_library_and_errors(path: Path) -> None:
    """No zmq, no server, no tqdm at import time (tqdm is loaded lazily)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    allowed_feedmux = {"feedmux.errors"} | {f"feedmux.client.{p.stem}" for p in STREAM_MODULES}
    for name in imported:
        top = name.split(".")[0]
        if top == "feedmux":
            assert name in allowed_feedmux, name
        else:
            assert top in sys.stdlib_module_names, name
