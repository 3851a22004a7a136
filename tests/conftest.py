"""Suite-wide checks and order: no shared-memory segment of feedmux outlives its server,
no test leaves a signal handler or a blocked signal behind it, hypothesis judges no
example by its time, and the long tests start first.

Hypothesis's default deadline (200 ms an example) is a speed assertion: on a
loaded machine it fails examples that are slow, not wrong. The suite's profile
drops it (speed is measured by ``benchmarks/``); every other setting stays
hypothesis's own or the test's.

The order matters to a parallel run (``pytest -n``): xdist hands out the tests
in collection order, so a long test collected last runs alone at the end while
the other processes sit idle. Longest first, as far as a test says: those
marked ``slow``, then by the timeout a test declares (its bound: the longer,
the earlier), then those that start real processes (``tests/integration``) or
run many examples (hypothesis), then the rest, each group in its collected
order, so that the short tests fill the tail.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from feedmux._plumbing.shm import SHM_DIR, orphaned_segments

settings.register_profile("feedmux", deadline=None)
settings.load_profile("feedmux")

#: Where the tests that start real processes live (the second group of the order).
INTEGRATION = Path(__file__).resolve().parent / "integration"

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


#: The signals whose handling a test must leave as it found it (a handler left installed
#: made a Ctrl-C reach a stopped test's handler, not pytest's: the run went on).
GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_state() -> tuple[dict[int, Any], frozenset[int]]:
    """The handlers of :data:`GUARDED_SIGNALS` and the signals this thread blocks."""
    handlers = {int(signum): signal.getsignal(signum) for signum in GUARDED_SIGNALS}
    return handlers, frozenset(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def signal_changes(before: tuple[Mapping[int, Any], frozenset[int]],
                   after: tuple[Mapping[int, Any], frozenset[int]]) -> list[str]:
    """What differs between two :func:`signal_state` readings, in words."""
    changes = [f"{signal.Signals(signum).name} handler {before[0][signum]!r} -> {handler!r}"
               for signum, handler in after[0].items() if handler is not before[0][signum]]
    if after[1] != before[1]:
        changes.append(f"blocked signals {sorted(before[1])} -> {sorted(after[1])}")
    return changes


def restore_signal_state(state: tuple[Mapping[int, Any], frozenset[int]]) -> None:
    for signum, handler in state[0].items():
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, state[1])


@pytest.fixture(autouse=True)
def restores_signal_handlers() -> Iterator[None]:
    """Every test leaves SIGINT's and SIGTERM's handlers and the signal mask as it found
    them: restored after it, and the test fails naming what it left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal_state()
    yield
    changes = signal_changes(before, signal_state())
    if changes:
        restore_signal_state(before)
        pytest.fail(f"the test left signal handling changed: {'; '.join(changes)}")


def start_rank(item: pytest.Item) -> tuple[int, float, int]:
    """The sort key of ``item``'s place in the run (see the module docstring)."""
    declared = item.get_closest_marker("timeout")
    bound = float(declared.args[0]) if declared is not None and declared.args else 0.0
    many = (INTEGRATION in item.path.parents
            or getattr(getattr(item, "obj", None), "is_hypothesis_test", False))
    return (item.get_closest_marker("slow") is None, -bound, not many)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=start_rank)  # (stable: each group keeps its collected order)
