"""Regression tests for the bugs of the hardening issue, each against real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from feedmux import RemoteLoader, Server
from feedmux.errors import TransportError
from feedmux.protocol import Credit, Hello, Welcome, decode, encode
from tests.integration.conftest import _START_LINE, ROOT, pid_alive, wait_until
from tests.integration.hard_samplers import STUCK_LINE

SAMPLERS = "tests.integration.hard_samplers"


@pytest.fixture
def started(servers: list[Server]) -> list[Server]:
    """The servers a test started (stopped afterwards)."""
    return servers


def _samples(server: Server, timeout: float = 15.0) -> list[dict[str, Any]]:
    with RemoteLoader(server.data_address, control=server.control_address,
                      timeout=timeout) as loader:
        return list(loader)


def test_skip_with_workers_survives_a_shard_whose_first_pull_raises(
        started: list[Server]) -> None:
    server = Server(f"{SAMPLERS}:first_pull_fails", bind="tcp://127.0.0.1:0", workers=2,
                    epochs=2, on_error="skip")
    started.append(server.start())
    # Shard 0 gives item 0 then fails, shard 1 fails on its first pull: each epoch is
    # item 0 alone, and the run ends (before the fix the server waited for shard 1
    # forever and its worker logged the error in a tight loop).
    assert [int(s["id"]) for s in _samples(server)] == [0, 0]
    assert server.join(10) == 0


def test_forked_workers_never_share_the_global_rngs(started: list[Server]) -> None:
    server = Server(f"{SAMPLERS}:draws", bind="tcp://127.0.0.1:0", workers=2, epochs=1)
    started.append(server.start())
    samples = _samples(server)
    assert len(samples) == 20
    assert len({float(s["np"]) for s in samples}) == 20
    assert len({s["py"] for s in samples}) == 20


def test_a_port_out_of_range_is_refused() -> None:
    with pytest.raises(TransportError, match=r"expected a port in \[0, 65535\], got 99999"):
        Server(f"{SAMPLERS}:stuck", bind="tcp://127.0.0.1:99999").start(timeout=20)


def test_a_server_started_from_a_threaded_parent_is_not_forked(started: list[Server]) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(30,))
    thread.start()
    try:
        server = Server(f"{SAMPLERS}:draws", bind="tcp://127.0.0.1:0", epochs=1)
        started.append(server.start())
        assert server.start_method == "interpreter"
        assert len(_samples(server)) == 20
    finally:
        release.set()
        thread.join(5)
    assert not thread.is_alive()


def _read_lines(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


@contextlib.contextmanager
def _cli_server(*args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``feedmux serve ARGS`` on port 0, its stderr lines collected; killed by pid after."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "feedmux", "serve", *args, "--bind", "tcp://127.0.0.1:0"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(process.stderr, lines))
    reader.start()
    try:
        wait_until(lambda: any("serving" in line for line in lines), 20, "the start line")
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        reader.join(10)
    assert not reader.is_alive()


@contextlib.contextmanager
def _trainer(lines: list[str]) -> Iterator[None]:
    """A trainer that said hello to the server of ``lines`` (welcomed), connected till the end.

    The server samples once a trainer said hello (its hello tells the delivery
    mode) and granted credit on its data socket (a trainer that only says hello,
    as a DataLoader's main process asking len(), never counts). It welcomes a
    waiting trainer again before it starts, and forgets one whose connection is
    gone by then: the sockets stay open.
    """
    start = next(match for line in lines if (match := _START_LINE.search(line)))
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    data = context.socket(zmq.DEALER)
    data.linger = 0
    data.setsockopt(zmq.ROUTING_ID, b"stuck-test")
    try:
        socket.connect(start[2])
        data.connect(start[1])
        socket.send_multipart(encode(Hello("stuck-test")))
        assert socket.poll(10_000), "no welcome within 10 s"
        assert isinstance(decode(socket.recv_multipart()), Welcome)
        data.send_multipart(encode(Credit(credits=4, client_id="stuck-test")))
        yield
    finally:
        data.close()
        socket.close()
        context.term()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_stops_a_server_stuck_in_user_code(signum: int) -> None:
    with _cli_server(f"{SAMPLERS}:stuck") as (process, lines), _trainer(lines):
        # One hello answered, and the server is in the streamer, which never returns.
        # The welcome goes out before sampling starts: a signal sent before the streamer
        # runs stops the server gracefully (exit 0), which is not what is tested here.
        wait_until(lambda: any(STUCK_LINE in line for line in lines), 10,
                   "the server to run the stuck streamer")
        _signal_twice(process, signum, lines)
        # Before the fix no number of signals stopped it.
        assert process.wait(5) == 128 + signum


def _signal_twice(process: subprocess.Popen[str], signum: int, lines: list[str],
                  taken: str = "") -> None:
    """Signal the server, and again once it wrote that it took the first (two signals
    close together may reach Python's handler as one), or the line ``taken``."""
    process.send_signal(signum)
    taken = taken or f"{signal.Signals(signum).name} received"
    wait_until(lambda: any(taken in line for line in lines), 10, f"the line {taken!r}")
    process.send_signal(signum)


@pytest.mark.parametrize(("signum", "sampler"),
                         [(signal.SIGINT, "stuck"), (signal.SIGTERM, "spinning")])
def test_a_second_signal_stops_the_server_and_every_worker_stuck_in_user_code(
        signum: int, sampler: str) -> None:
    with _cli_server(f"{SAMPLERS}:{sampler}", "--workers", "2") as (process, lines), \
            _trainer(lines):
        # Both workers run the streamer (their lines may share one line of the pipe).
        wait_until(lambda: "".join(lines).count(STUCK_LINE) == 2, 20,
                   "both workers to run the stuck streamer")
        started = next(line for line in lines if "sampling worker(s): pids" in line)
        workers = [int(pid) for pid in started.split("pids")[1].split(",")]
        pids = [process.pid, *workers]
        try:
            # The first signal's shutdown waits a moment for the workers, which never
            # look: the second comes then (before the fix it cut that wait short and
            # stopped nothing: the server and both workers still ran 10 s later).
            _signal_twice(process, signum, lines, taken="shutting down")
            second_sent = process.returncode is None  # Popen signals no reaped process
            # Bounded well below "never": the bug left them running for good, while a
            # loaded parallel run took over 5 s to tear three processes down.
            wait_until(lambda: not any(map(pid_alive, pids)), 15,
                       f"the server and its workers {pids} to stop")
        finally:
            for pid in workers:  # the server is killed by _cli_server
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process.wait(5)
        if second_sent:
            assert process.returncode == 128 + signum


def test_keygen_never_leaves_the_secret_readable(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from feedmux._plumbing.curve import create_keys

    # With chmod doing nothing, the mode left is the mode the file was created with.
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    previous = os.umask(0)
    try:
        public, secret = create_keys(tmp_path, "server")
    finally:
        os.umask(previous)
    assert secret.stat().st_mode & 0o777 == 0o600
    assert public.stat().st_mode & 0o777 == 0o644


def test_a_failed_bind_leaves_no_thread_or_socket_behind(tmp_path: Path,
                                                          started: list[Server]) -> None:
    from feedmux._plumbing.curve import create_keys
    from feedmux.server._shell import SocketShell
    from feedmux.server.config import ServerConfig

    _, secret = create_keys(tmp_path, "server")
    first = Server(f"{SAMPLERS}:stuck", bind="tcp://127.0.0.1:0")
    started.append(first.start())
    threads = threading.active_count()
    config = ServerConfig(source=f"{SAMPLERS}:stuck", bind=first.data_address,
                          control="tcp://127.0.0.1:0", curve_secret=str(secret))
    with pytest.raises(TransportError, match=r"(?i)address already in use"):
        SocketShell(config, stopping=False)
    wait_until(lambda: threading.active_count() == threads, 5, "the authenticator to stop")


def test_a_streamer_reusing_one_array_never_corrupts_a_sample(
        started: list[Server]) -> None:
    server = Server(f"{SAMPLERS}:reused", bind="tcp://127.0.0.1:0", epochs=1, hwm=4,
                    factory_kwargs={"count": 120, "megabytes": 1})
    started.append(server.start())
    samples = _samples(server, timeout=30)
    assert len(samples) == 120
    corrupted = [int(s["id"]) for s in samples if not (s["x"] == int(s["id"])).all()]
    assert corrupted == []


def test_a_refused_curve_key_is_reported_on_both_sides(tmp_path: Path) -> None:
    import re

    from feedmux._plumbing.curve import create_keys
    from feedmux.errors import TransportTimeoutError

    server_public, server_secret = create_keys(tmp_path, "server")
    create_keys(tmp_path / "allowed", "trainer")
    _, stranger = create_keys(tmp_path, "stranger")
    with _cli_server(f"{SAMPLERS}:draws", "--curve-secret", str(server_secret),
                     "--curve-clients", str(tmp_path / "allowed")) as (_, lines):
        start = next(line for line in lines if "serving" in line)
        found = re.search(r"data (\S+), control (\S+),", start)
        assert found is not None, start
        with RemoteLoader(found[1], control=found[2], timeout=2.0,
                          curve_server_key=str(server_public),
                          curve_certificate=str(stranger)) as loader, pytest.raises(
                TransportTimeoutError, match="CURVE authentication refused"):
            next(loader)
        wait_until(lambda: any("CURVE authentication refused" in line for line in lines), 10,
                   "the server to log the refusal")
