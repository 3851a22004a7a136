"""Real servers and trainers on 127.0.0.1: epochs, several trainers, workers, errors."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import feedmux
from feedmux.client.remote import RemoteLoader, fetch_stats
from tests.integration.conftest import CheckedThread, Endpoints, wait_until

pytestmark = pytest.mark.timeout(60)

SAMPLER = "tests.integration.samplers"


def consume(loader: RemoteLoader) -> dict[int, list[int]]:
    """Every id this loader receives, by server epoch, until the stream ends."""
    seen: dict[int, list[int]] = {}
    with loader:
        for meta, sample in loader:
            seen.setdefault(meta.epoch, []).append(int(sample["id"]))
    return seen


def assert_exactly_once(seen: list[dict[int, list[int]]], epochs: int, ids: int) -> None:
    for epoch in range(1, epochs + 1):
        counts = Counter(i for part in seen for i in part.get(epoch, []))
        assert sorted(counts) == list(range(ids)), f"epoch {epoch}: ids missing or unknown"
        assert max(counts.values()) == 1, f"epoch {epoch}: some ids seen twice"
    assert set().union(*seen) <= set(range(1, epochs + 1))


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_one_trainer_gets_every_sample_once_per_epoch(serve: Any, tmp_path: Path,
                                                      transport: str) -> None:
    """Over ipc too: the end-of-stream handshake, not LINGER, makes the tail arrive."""
    endpoints = Endpoints.ipc(tmp_path) if transport == "ipc" else None
    server = serve(f"{SAMPLER}:numbered", "--epochs", "3", endpoints=endpoints)
    loader = RemoteLoader(server.data, control=server.control, timeout=20, with_meta=True)
    seen = consume(loader)
    assert_exactly_once([seen], epochs=3, ids=200)
    assert server.wait(timeout=20) == 0


def test_two_trainers_receive_disjoint_complete_epochs(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--arg", "per_stream=500", "--epochs", "2",
                   "--samples-per-message", "16", "--min-trainers", "2")

    def trainer() -> dict[int, list[int]]:
        return consume(RemoteLoader(server.data, control=server.control, timeout=20,
                                    with_meta=True, world_size=2))

    threads = [CheckedThread(trainer) for _ in range(2)]
    results = [thread.join(timeout=40) for thread in threads]
    assert all(results), "a trainer received nothing"
    assert_exactly_once(results, epochs=2, ids=2000)
    assert server.wait(timeout=20) == 0


def test_two_workers_keep_exactly_once(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--workers", "2", "--epochs", "3")
    loader = RemoteLoader(server.data, control=server.control, timeout=20, with_meta=True)
    seen = consume(loader)
    assert_exactly_once([seen], epochs=3, ids=200)
    assert server.wait(timeout=20) == 0


def test_positions_number_each_epoch(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--workers", "2", "--epochs", "2")
    positions: dict[int, list[int]] = {}
    with RemoteLoader(server.data, control=server.control, timeout=20,
                      with_meta=True) as loader:
        for meta, _ in loader:
            positions.setdefault(meta.epoch, []).append(meta.position)
        assert len(loader) == 200
    assert {e: sorted(p) for e, p in positions.items()} == {1: list(range(200)),
                                                           2: list(range(200))}


def test_len_and_stream_data_follow_the_epoch_size(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered")
    loader = RemoteLoader(server.data, control=server.control, timeout=20, world_size=2)
    with loader:
        stream = feedmux.Stream(loader)
        with pytest.raises(TypeError, match="epoch size is not known"):
            len(loader)
        deadline = time.monotonic() + 10
        while loader.epoch_size is None and time.monotonic() < deadline:
            stream.next()
        assert len(loader) == 100
        assert stream.increment_epoch()
        assert len(list(stream.data())) == 100


def test_remote_exception_surfaces_as_remote_error(serve: Any) -> None:
    server = serve(f"{SAMPLER}:failing", "--arg", "after=5")
    with RemoteLoader(server.data, control=server.control, timeout=20) as loader:
        with pytest.raises(feedmux.RemoteError) as raised:
            for _ in loader:
                pass
    error = raised.value
    assert error.remote_type == "ValueError"
    # The message names the streamer that raised (and how --on-error skip would go on).
    assert error.remote_message.startswith(
        "boom after 5 samples (raised by streamer tests.integration.samplers._failing(5); ")
    assert "_failing" in error.remote_traceback
    assert server.wait(timeout=10) == 1


def test_on_error_skip_keeps_serving(serve: Any) -> None:
    server = serve(f"{SAMPLER}:failing", "--arg", "after=5", "--on-error", "skip",
                   "--epochs", "3")
    with RemoteLoader(server.data, control=server.control, timeout=20,
                      with_meta=True) as loader:
        epochs = Counter(meta.epoch for meta, _ in loader)
    assert epochs == {1: 5, 2: 5, 3: 5}
    assert server.wait(timeout=10) == 0
    assert "boom after 5 samples" in server.stderr


def test_on_error_skip_inside_a_mux_skips_only_the_failing_stream(serve: Any) -> None:
    server = serve(f"{SAMPLER}:partly_failing", "--on-error", "skip", "--epochs", "2")
    with RemoteLoader(server.data, control=server.control, timeout=20,
                      with_meta=True) as loader:
        seen: dict[int, list[int]] = {}
        for meta, sample in loader:
            seen.setdefault(meta.epoch, []).append(int(sample["id"]))
    expected = list(range(5)) + list(range(100, 120))
    assert {e: sorted(ids) for e, ids in seen.items()} == {1: expected, 2: expected}
    assert server.wait(timeout=10) == 0


def test_stats_and_ping(serve: Any, spawn: Any, tmp_path: Path) -> None:
    server = serve(f"{SAMPLER}:numbered")
    with RemoteLoader(server.data, control=server.control, timeout=20) as loader:
        for _, _sample in zip(range(300), loader, strict=False):
            pass
        stats = fetch_stats(server.control, timeout=5)
        assert stats["samples_sent"] >= 300
        assert stats["epoch_size"] == 200
        assert stats["connected_trainers"] == 1
        assert loader.last_meta is not None
        assert stats["server_id"] == loader.last_meta.server_id
    ping = spawn("ping", server.control)
    assert ping.wait(timeout=10) == 0
    nobody = spawn("ping", Endpoints.ipc(tmp_path).control, "--timeout", "0.3")
    assert nobody.wait(timeout=10) == 1


def test_a_slow_trainer_still_gets_the_whole_stream(serve: Any) -> None:
    """The end-of-stream handshake waits for a live trainer that reads slowly."""
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1", "--samples-per-message",
                   "10", "--hwm", "2")
    ids = []
    with RemoteLoader(server.data, control=server.control, timeout=20, hwm=2) as loader:
        for index, sample in enumerate(loader):
            if index == 100:
                # A training step (not a synchronisation) longer than the 3 s after which
                # a silent trainer no longer counts as connected.
                time.sleep(4.5)
            ids.append(int(sample["id"]))
    assert sorted(ids) == list(range(200))
    assert server.wait(timeout=20) == 0


def test_logs_a_start_line_and_periodic_throughput(serve: Any) -> None:
    server = serve(f"{SAMPLER}:numbered", "--log-every", "0.2", "--workers", "2")
    with RemoteLoader(server.data, control=server.control, timeout=20) as loader:

        def logged_twice() -> bool:
            # Past the first epoch too: its size is logged once the epoch is over (a loaded
            # machine logged two throughput lines within the first 100 samples).
            for _ in range(100):
                next(loader)
            return (sum("samples/s" in line for line in server.stderr.splitlines()) >= 2
                    and "epoch size is" in server.stderr)

        wait_until(logged_twice, 20, "two throughput log lines and the epoch size")
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    stderr = server.stderr
    start = next(line for line in stderr.splitlines() if "serving" in line)
    assert "2 worker(s)" in start
    # The line names the ports the system picked, not the port 0 that was asked for.
    for endpoint in (server.data, server.control):
        assert re.fullmatch(r"tcp://127\.0\.0\.1:[1-9][0-9]*", endpoint), endpoint
    assert server.data != server.control
    assert "epoch size is 200 samples" in stderr
    assert sum("samples/s" in line for line in stderr.splitlines()) >= 2


def test_the_cli_logs_the_bound_endpoints(serve: Any) -> None:
    # serve() reads the start line with a bound on the wait.
    server = serve(f"{SAMPLER}:numbered", "--epochs", "1")
    for endpoint in (server.data, server.control):
        assert re.fullmatch(r"tcp://127\.0\.0\.1:[1-9][0-9]*", endpoint), endpoint
    with RemoteLoader(server.data, control=server.control, timeout=20) as loader:
        assert len(list(loader)) == 200
    assert server.wait(timeout=20) == 0
