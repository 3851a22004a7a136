"""Dead peers, restarts, signals, bad arguments and stalled trainers."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import feedmux
from feedmux.client.remote import RemoteLoader, fetch_stats
from tests.integration.conftest import Endpoints, child_pids, pid_alive, wait_until

pytestmark = pytest.mark.timeout(60)

SAMPLER = "tests.integration.samplers"


def test_timeout_when_no_server(endpoints: Endpoints) -> None:
    loader = RemoteLoader(endpoints.data, control=endpoints.control, timeout=0.5)
    started = time.monotonic()
    with loader, pytest.raises(feedmux.TransportTimeoutError, match=endpoints.data):
        next(iter(loader))
    assert time.monotonic() - started < 5
    assert isinstance(feedmux.TransportTimeoutError("x"), TimeoutError)


def test_trainer_continues_after_server_killed_and_restarted(
    spawn: Any, endpoints: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    first = spawn("serve", f"{SAMPLER}:numbered", *endpoints.args())
    loader = RemoteLoader(endpoints.data, control=endpoints.control, timeout=30, with_meta=True)
    with loader, caplog.at_level(logging.WARNING, logger="feedmux.client"):
        meta, _sample = next(loader)
        old_id = meta.server_id
        for _ in range(10_000):  # the welcome is read while iterating
            next(loader)
            if loader.server_ids[0] == old_id:
                break
        assert loader.server_ids[0] == old_id
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        spawn("serve", f"{SAMPLER}:numbered", *endpoints.args())
        # Drain what was queued from the first server, then samples from the second arrive.
        for _ in range(2000):
            meta, _sample = next(loader)
            if meta.server_id != old_id:
                break
        assert meta.server_id != old_id
        for _ in range(10_000):
            next(loader)
            if loader.server_ids[0] not in ("", old_id):
                break
        assert loader.server_ids[0] == meta.server_id
    assert any("restarted" in r.getMessage() and old_id in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_stops_cleanly_without_orphans(spawn: Any, endpoints: Endpoints,
                                               workers: str) -> None:
    server = spawn("serve", f"{SAMPLER}:numbered", "--workers", workers, *endpoints.args())
    with RemoteLoader(endpoints.data, control=endpoints.control, timeout=20) as loader:
        next(loader)
    children = child_pids(server.pid)
    assert len(children) == (2 if workers == "2" else 0)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=5) == 0
    wait_until(lambda: not any(pid_alive(c) for c in children), 5, "the workers to exit")


def test_server_killed_takes_its_workers_along(spawn: Any, endpoints: Endpoints) -> None:
    server = spawn("serve", f"{SAMPLER}:numbered", "--workers", "2", *endpoints.args())
    wait_until(lambda: len(child_pids(server.pid)) == 2, 10, "two workers")
    children = child_pids(server.pid)
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
def test_bad_source_exits_2_with_its_reason(spawn: Any, endpoints: Endpoints, source: str,
                                            expected: str) -> None:
    process = spawn("serve", source, *endpoints.args())
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    assert expected in stderr


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_stalled_trainer_bounds_server_memory(spawn: Any, endpoints: Endpoints) -> None:
    server = spawn("serve", f"{SAMPLER}:big", "--arg", "megabytes=4", "--hwm", "2",
                   *endpoints.args())
    loader = RemoteLoader(endpoints.data, control=endpoints.control, timeout=20, hwm=1)
    with loader:
        next(loader)  # connected; now this trainer stops reading
        time.sleep(1.0)
        sent_before = fetch_stats(endpoints.control)["samples_sent"]
        rss_before = _rss_bytes(server.pid)
        time.sleep(2.0)
        sent_after = fetch_stats(endpoints.control)["samples_sent"]
        rss_after = _rss_bytes(server.pid)
    # Unbounded, the sampler would have pushed hundreds of 4 MiB samples by now.
    assert sent_after - sent_before <= 2
    assert rss_after - rss_before < 64 * (1 << 20)
    assert os.path.exists(f"/proc/{server.pid}")
