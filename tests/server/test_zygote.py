"""The zygote: a single-threaded process that forks workers on request and reports exits."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from feedmux.server._sources.zygote import Zygote, pid_alive, worker_name

pytestmark = pytest.mark.timeout(60)


def _work(seat: int, generation: int, server_alive: Callable[[], bool]) -> None:
    """Seat 0 returns at once, seat 1 raises, the others wait to be killed."""
    if seat == 0:
        return
    if seat == 1:
        raise RuntimeError("a sampler that fails")
    while server_alive():
        time.sleep(0.05)


def _exits(zygote: Zygote, count: int, timeout: float = 20.0) -> dict[int, int]:
    """The first ``count`` exits the zygote reports, waited for with a bound."""
    found: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(found) < count:
        assert time.monotonic() < deadline, f"only {found} of {count} exits reported"
        zygote.wait(0.1)
        found.update(zygote.exits())
    return found


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_the_zygote_forks_on_request_names_its_workers_and_reports_their_exits() -> None:
    zygote = Zygote(_work)
    zygote.start()
    try:
        assert zygote.pid is not None
        returns, raises, waits = (zygote.fork(seat, 1) for seat in (0, 1, 2))
        assert returns and raises and waits
        # Named before its loop answers: the replies say it is there.
        assert _comm(zygote.pid) == "feedmux-zygote"
        assert len(os.listdir(f"/proc/{zygote.pid}/task")) == 1  # one thread, no context
        assert os.getpid() not in (returns, raises, waits)
        deadline = time.monotonic() + 10  # it names itself just after the fork
        while _comm(waits) != worker_name(2):
            assert time.monotonic() < deadline, _comm(waits)
            time.sleep(0.01)
        assert worker_name(2) == "feedmux-wkr-2"
        os.kill(waits, signal.SIGKILL)
        assert _exits(zygote, 3) == {returns: 0, raises: 1, waits: -signal.SIGKILL}
        assert len(os.listdir(f"/proc/{zygote.pid}/task")) == 1
        assert threading.active_count() >= 1  # this process's threads are not the zygote's
    finally:
        zygote.stop()


def test_closing_the_pair_kills_the_workers_and_ends_the_zygote() -> None:
    zygote = Zygote(_work)
    zygote.start()
    pids = [zygote.fork(seat, 1) for seat in (2, 3)]
    assert all(pids) and all(pid_alive(pid) for pid in pids if pid)
    zygote.stop()
    assert zygote.pid is not None and not pid_alive(zygote.pid)
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids if pid):
        assert time.monotonic() < deadline, "the workers outlived their zygote's stop"
        time.sleep(0.02)  # a bounded look at /proc, not a synchronisation


def test_a_dead_zygote_is_seen_and_forks_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    zygote = Zygote(_work)
    zygote.start()
    try:
        worker = zygote.fork(2, 1)
        assert worker is not None and zygote.pid is not None
        os.kill(zygote.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not zygote.gone:
            assert time.monotonic() < deadline, "the zygote's death was not seen"
            zygote.wait(0.1)
            zygote.exits()
        assert "exited with code -9: no sampling worker can be started" in caplog.text
        assert zygote.fork(3, 1) is None
        assert pid_alive(worker)  # its workers go on: the server still runs
    finally:
        zygote.stop()
        if worker is not None and pid_alive(worker):
            os.kill(worker, signal.SIGKILL)
