"""Suite-wide checks: no shared-memory segment of feedmux outlives the test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from feedmux._shm import SHM_DIR, sweep


def _segments() -> set[str]:
    return {path.name for path in Path(SHM_DIR).glob("feedmux-*")}


@pytest.fixture(scope="session", autouse=True)
def no_leaked_shared_memory() -> Iterator[None]:
    """Every segment the suite created is gone at its end.

    The integration fixtures SIGKILL the servers they spawned; a killed server's
    segment is removed by the next server start on the host (``sweep``), which this
    check stands in for. A segment left by a process that is still alive fails it.
    """
    before = _segments()
    yield
    sweep()
    leaked = _segments() - before
    assert not leaked, f"shared-memory segments left behind by the suite: {sorted(leaked)}"
