"""Suite-wide checks: no shared-memory segment of feedmux outlives its server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from feedmux._plumbing.shm import SHM_DIR, orphaned_segments

#: Seconds the reapers get to remove the segments of the suite's last killed servers.
REAPER_GRACE = 10.0


def _segments() -> set[str]:
    return {path.name for path in Path(SHM_DIR).glob("feedmux-*")}


@pytest.fixture(scope="session", autouse=True)
def no_leaked_shared_memory() -> Iterator[None]:
    """Every segment the suite's servers created is gone once they are.

    The integration fixtures SIGKILL many of the servers they spawned: nothing of
    those runs after the signal, so this checks the reaper each pool starts
    (feedmux._plumbing.shm), not the next start's sweep. Segments of servers still
    running (another suite's on a shared machine) are not this suite's to judge.
    """
    before = _segments()
    yield
    deadline = time.monotonic() + REAPER_GRACE
    while True:
        leaked = sorted(set(orphaned_segments()) - before)
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"shared-memory segments of servers that are gone: {leaked}"
