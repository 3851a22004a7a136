"""No benchmark asks for a delivery that is gone.

``reliable=`` (``Server``, ``RemoteLoader``) and ``--reliable`` (``feedmux serve``)
are deprecated no-ops: every free trainer gets the acknowledged delivery, and the
at-most-once plain delivery they chose against is gone. A benchmark that still
passes them warns on every run and compares a mode with itself. This reads the
benchmarks' source (nothing runs): a ``reliable`` keyword argument, a ``reliable``
key of a dict literal or a subscript assignment (options handed on with ``**``),
and ``--reliable`` in a list, tuple or set literal (a command line).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def dead_delivery_options(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` passes ``reliable`` or ``--reliable``, as ``filename:line: what``."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "reliable":
                    found.append((keyword.lineno,
                                  f"reliable= passed to {ast.unparse(node.func)}"))
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and key.value == "reliable":
                    found.append((key.lineno, "a 'reliable' key in a dict literal"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.slice, ast.Constant) and node.slice.value == "reliable":
                found.append((node.lineno, f"{ast.unparse(node)} assigned"))
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            for element in node.elts:
                if (isinstance(element, ast.Constant) and isinstance(element.value, str)
                        and any(word == "--reliable" or word.startswith("--reliable=")
                                for word in element.value.split())):
                    found.append((element.lineno, "--reliable in a command line"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_no_benchmark_passes_reliable() -> None:
    files = sorted(BENCHMARKS.rglob("*.py"))
    assert len(files) > 20  # the benchmarks were found
    found = [finding for path in files for finding in dead_delivery_options(
        path.read_text(), str(path.relative_to(BENCHMARKS.parent)))]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("source", [
    """
    loader = feedmux.RemoteLoader(address, control=control, reliable=True)
    """,
    """
    server = feedmux.Server(SOURCE, bind=address, reliable=mode == "reliable").start()
    """,
    """
    options = {"bind": address, "reliable": True}
    server = feedmux.Server(SOURCE, **options)
    """,
    """
    options: dict[str, Any] = {}
    options["reliable"] = True
    """,
    """
    subprocess.run([sys.executable, "-m", "feedmux", "serve", SOURCE, "--reliable"])
    """,
    """
    mode = {"reliable": ["--reliable"]}.get(cell.mode, [])
    """,
    """
    command = (*serve, "--seed", "1", "--reliable=1")
    """,
])
def test_the_check_finds_a_made_up_dead_option(source: str) -> None:
    assert dead_delivery_options(textwrap.dedent(source), "made_up.py")


def test_the_check_lets_the_default_delivery_and_prose_through() -> None:
    source = textwrap.dedent('''
        """Against ``--reliable`` and reliable=True of earlier runs: both are gone."""
        loader = feedmux.RemoteLoader(address, control=control, timeout=60)
        server = feedmux.Server(SOURCE, bind=address, seed=1)
        label = "plain delivery is gone: reliable is the default"
        command = [sys.executable, "-m", "feedmux", "serve", SOURCE, "--seed", "1"]
    ''')
    assert dead_delivery_options(source) == []
