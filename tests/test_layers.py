"""Layering: the protocol and the sampling library stay pure; server and client stay apart.

Two kinds of check. At run time, a fresh interpreter (so that modules this test
process has imported already cannot mask an import) imports one package and
reports every module that came along. Statically, the import statements of
every module are read with ast, so an import inside a function or a rarely
taken branch counts as much as one at the top.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "feedmux"

# What each pure package must never bring in, at run time or in its source.
PURE = {
    "feedmux.protocol": ("zmq", "feedmux.server", "feedmux.client", "feedmux.sampling"),
    "feedmux.sampling": ("zmq", "feedmux.server", "feedmux.client", "feedmux._worker_info"),
}
# The serving side and the training side know the protocol, never each other.
APART = {
    "feedmux.server": ("feedmux.client",),
    "feedmux.client": ("feedmux.server",),
}


def _is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _forbidden(names: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(name for name in names if any(_is_within(name, bad) for bad in forbidden))


def _modules_after(statements: str) -> set[str]:
    """The names in ``sys.modules`` after a fresh interpreter ran ``statements``."""
    code = f"{statements}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


# Imports a subpackage with the top-level feedmux/__init__.py skipped (it re-exports
# the whole public API, server and client included), so that what is measured is
# the subpackage's own import graph.
_WITHOUT_TOP_LEVEL = f"""
import sys, types
top = types.ModuleType("feedmux")
top.__path__ = [{str(PACKAGE)!r}]
sys.modules["feedmux"] = top
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("package", sorted(PURE))
def test_pure_package_imports_nothing_forbidden(package: str) -> None:
    loaded = _modules_after(f"{_WITHOUT_TOP_LEVEL}\nimport {package}")
    assert package in loaded
    assert _forbidden(loaded, PURE[package]) == [], f"importing {package} brought these in"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("package", sorted(PURE))
def test_pure_package_imported_the_usual_way_imports_nothing_forbidden(package: str) -> None:
    loaded = _modules_after(f"import {package}")
    assert _forbidden(loaded, PURE[package]) == [], f"importing {package} brought these in"


def test_worker_info_is_a_leaf() -> None:
    """User code reads ``feedmux.worker_info()`` without loading zmq or any other layer."""
    loaded = _modules_after(f"{_WITHOUT_TOP_LEVEL}\nimport feedmux._worker_info")
    others = sorted(name for name in loaded if _is_within(name, "feedmux")
                    and name not in ("feedmux", "feedmux._worker_info"))
    assert others == [] and "zmq" not in loaded


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module named by an import statement in ``source`` (the source of ``module``).

    Relative imports are resolved; ``from a import b`` names both ``a`` and ``a.b``
    (``b`` may be a module).

    Examples
    --------
    >>> sorted(imports_in("from ..server import config", "feedmux.client.remote"))
    ['feedmux.server', 'feedmux.server.config']
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _imports_by_module(package: str) -> dict[str, set[str]]:
    folder = REPO.joinpath(*package.split("."))
    found = {}
    for path in sorted(folder.rglob("*.py")):
        found[_module_name(path)] = imports_in(
            path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py"
        )
    assert found, f"no modules under {folder}"
    return found


@pytest.mark.parametrize("package", sorted({**PURE, **APART}))
def test_no_module_imports_across_a_layer(package: str) -> None:
    forbidden = {**PURE, **APART}[package]
    crossings = [
        f"{module} imports {name}"
        for module, names in _imports_by_module(package).items()
        for name in _forbidden(names, forbidden)
    ]
    assert crossings == []


def test_the_import_reader_sees_imports_anywhere() -> None:
    # The layer checks above pass by finding nothing; this shows they can find something.
    source = """
import zmq.asyncio
from . import stream
def later():
    from feedmux import server
    from ...feedmux_other import thing
"""
    found = imports_in(source, "feedmux.client.remote")
    assert {"zmq.asyncio", "feedmux.client.stream", "feedmux.server"} <= found
    assert "zmq" in _imports_by_module("feedmux.client")["feedmux.client.remote"]


def test_every_public_name_resolves_and_is_listed_sorted() -> None:
    import feedmux

    assert list(feedmux.__all__) == sorted(feedmux.__all__)
    for name in feedmux.__all__:
        assert getattr(feedmux, name) is not None, name
    assert set(feedmux.__all__) <= set(dir(feedmux))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = feedmux.nope  # type: ignore[attr-defined]


# Ray is an optional extra: only feedmux.ray may import it, and nothing imports feedmux.ray.
RAY_GLUE = "feedmux.ray"


def test_only_the_ray_package_imports_ray() -> None:
    crossings = [
        f"{module} imports {name}"
        for module, names in _imports_by_module("feedmux").items()
        if not _is_within(module, RAY_GLUE)
        for name in _forbidden(names, ("ray", RAY_GLUE))
    ]
    assert crossings == []


@pytest.mark.timeout(150)
def test_feedmux_imports_and_serves_without_ray() -> None:
    loaded = _modules_after(
        "import feedmux, feedmux.server, feedmux.client, feedmux.apps.cli\n"
        "from feedmux import RemoteLoader, Server, Stream"
    )
    assert _forbidden(loaded, ("ray", RAY_GLUE)) == []
