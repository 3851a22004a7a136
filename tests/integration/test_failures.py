"""Dead peers, restarts, signals, bad arguments and stalled trainers."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import feedmux
from feedmux.client.remote import RemoteLoader, SampleMeta, fetch_stats
from tests.integration.conftest import (
    Endpoints,
    descendant_pids,
    holds_for,
    pid_alive,
    wait_until,
    worker_pids,
)

pytestmark = pytest.mark.timeout(60)

SAMPLER = "tests.integration.samplers"


def test_timeout_when_no_server(tmp_path: Path) -> None:
    nobody = Endpoints.ipc(tmp_path)  # paths no server binds
    loader = RemoteLoader(nobody.data, control=nobody.control, timeout=0.5)
    started = time.monotonic()
    with loader, pytest.raises(feedmux.TransportTimeoutError, match=nobody.data):
        next(iter(loader))
    assert time.monotonic() - started < 5
    assert isinstance(feedmux.TransportTimeoutError("x"), TimeoutError)


def iterate_until(loader: RemoteLoader, condition: Callable[[SampleMeta], bool],
                  timeout: float, what: str) -> SampleMeta:
    """Take samples until one's meta satisfies ``condition``; fail after ``timeout`` s.

    Bounded by time, not by a number of samples: how many samples are queued ahead
    (or go by before a control answer) depends on how loaded the machine is.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta, _sample = next(loader)
        if condition(meta):
            return meta
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_trainer_continues_after_server_killed_and_restarted(
    serve: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ipc paths in the test's folder: the second server binds the very address of the
    # first, which no other process can take in between (a released tcp port can be).
    endpoints = Endpoints.ipc(tmp_path)
    first = serve(f"{SAMPLER}:numbered", endpoints=endpoints)
    loader = RemoteLoader(first.data, control=first.control, timeout=30, with_meta=True)
    with loader, caplog.at_level(logging.WARNING, logger="feedmux.client"):
        old_id = next(loader)[0].server_id
        iterate_until(loader, lambda _: loader.server_ids[0] == old_id, 20,
                      "the first server's welcome")  # read while iterating
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        serve(f"{SAMPLER}:numbered", endpoints=endpoints)
        # What the first server had queued comes first, then the second server's samples.
        new_id = iterate_until(loader, lambda meta: meta.server_id != old_id, 30,
                               "a sample from the restarted server").server_id
        iterate_until(loader, lambda _: loader.server_ids[0] == new_id, 30,
                      "the restarted server's welcome")
    assert any("restarted" in r.getMessage() and old_id in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_stops_cleanly_without_orphans(serve: Any, workers: str) -> None:
    server = serve(f"{SAMPLER}:numbered", "--workers", workers)
    with RemoteLoader(server.data, control=server.control, timeout=20) as loader:
        next(loader)
    children = descendant_pids(server.pid)
    # --workers 2: the zygote and the two workers it forked.
    assert len(children) == (3 if workers == "2" else 0)
    if workers == "2":
        assert len(worker_pids(server.pid)) == 2
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=5) == 0
    wait_until(lambda: not any(pid_alive(c) for c in children), 5, "the workers to exit")


def test_server_killed_takes_its_workers_along(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--workers", "2")
    wait_until(lambda: len(worker_pids(server.pid)) == 2, 10, "two workers")
    children = descendant_pids(server.pid)  # the zygote and its workers
    server.send_signal(signal.SIGKILL)
    server.wait(timeout=5)
    wait_until(lambda: not any(pid_alive(c) for c in children), 5, "orphaned workers to exit")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
        (f"{SAMPLER}:no_such_attr", "has no attribute 'no_such_attr'"),
        (f"{SAMPLER}:not_a_streamer", "expected a feedmux Streamer or mux"),
        ("missing_colon", "expected MODULE:ATTR"),
    ],
)
def test_bad_source_exits_2_with_its_reason(spawn: Any, source: str, expected: str) -> None:
    process = spawn("serve", source, *Endpoints.any_port().args())
    assert process.wait(timeout=20) == 2
    assert expected in process.stderr


MAX_QUEUED_SAMPLES = 16
MAX_GROWTH = 96 * (1 << 20)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("pool", [(), ("--no-shm",)], ids=["shm-pool", "sockets"])
def test_stalled_trainer_bounds_server_memory(serve: Any, pool: tuple[str, ...]) -> None:
    # With the same-host pool, the messages in flight are references, which the socket
    # queues would hold by the thousand: the server caps the unreceived ones per trainer
    # (2 x hwm), so the same bounds hold as for messages sent whole.
    server = serve(f"{SAMPLER}:big", "--arg", "megabytes=4", "--hwm", "2", *pool)
    rss_idle = _rss_bytes(server.pid)
    loader = RemoteLoader(server.data, control=server.control, timeout=20, hwm=1)
    with loader:
        next(loader)  # connected; now this trainer stops reading

        def bounded() -> bool:
            # What the queues on both sides (hwm 2 + 1) and the kernel's socket buffers
            # hold; unbounded, the sampler pushes hundreds of 4 MiB samples meanwhile.
            sent = fetch_stats(server.control, timeout=5)["samples_sent"]
            return sent <= MAX_QUEUED_SAMPLES and _rss_bytes(server.pid) - rss_idle < MAX_GROWTH

        assert holds_for(bounded, 3.0), (fetch_stats(server.control, timeout=5),
                                          _rss_bytes(server.pid) - rss_idle)
    assert server.returncode is None
