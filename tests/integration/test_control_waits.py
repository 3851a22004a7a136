"""Control never waits for the sampler: a server whose streamer holds the GIL still answers.

With the default ``--workers 1`` the server samples in its own thread and once
answered control only between two messages: a streamer taking 50 ms a sample
held statistics, heartbeats and hellos up to a sample's time (p50 52 ms, p99
0.15-0.5 s), and a sample of seconds (a huge image) let ``feedmux stats`` and
``top`` time out. A stand-in thread now answers control while the server's
thread is in the streamer. Speed is not asserted here: every answer must come
within a second (``benchmarks.bench_control`` reports the p99 of 100 calls);
before the stand-in, none came during the long sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from feedmux import RemoteLoader
from feedmux.client.remote import fetch_stats
from feedmux.protocol import CONTROL_LIMITS, Heartbeat, Hello, Welcome, decode, encode
from tests.integration.conftest import CheckedThread, Spawned
from tests.integration.hard_samplers import LONG_SAMPLE_LINE

SOURCE = "tests.integration.hard_samplers:gil_bound"
#: Each answer's bound: generous (a loaded machine), and far below the long sample.
ANSWER_WITHIN = 1.0


def _read(data: str, control: str, stop: threading.Event) -> int:
    """A trainer: read until told to stop; the samples it read."""
    count = 0
    with RemoteLoader(data, control=control, timeout=30) as loader:
        for _ in loader:
            count += 1
            if stop.is_set():
                return count
    return count


def _welcome(socket: zmq.Socket[Any], message: Any) -> Welcome:
    """Send ``message`` on a control DEALER; the welcome it gets, which must come within
    the bound (what else comes meanwhile, such as the offer of shared memory, is skipped)."""
    socket.send_multipart(encode(message))
    deadline = time.monotonic() + ANSWER_WITHIN
    while (remaining := deadline - time.monotonic()) > 0 and socket.poll(int(remaining * 1000)):
        answer = decode(socket.recv_multipart(), limits=CONTROL_LIMITS)
        if isinstance(answer, Welcome):
            return answer
    raise AssertionError(f"no welcome to {type(message).__name__} within {ANSWER_WITHIN} s")


@pytest.mark.slow
def test_stats_hellos_and_heartbeats_are_answered_while_the_streamer_holds_the_gil(
        serve: Callable[..., Spawned]) -> None:
    # 50 ms of pure Python a sample, and one sample of 4 s; --workers 1, the default.
    server = serve(SOURCE, "--arg", "ms=50", "--arg", "long_at=20", "--arg", "long_s=4")
    stop = threading.Event()
    trainer = CheckedThread(_read, server.data, server.control, stop)
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    try:
        server.wait_for_stderr(lambda text: LONG_SAMPLE_LINE in text, 30,
                               "the streamer's long sample")
        # While the streamer is in its long sample: a new trainer's hello, its heartbeat,
        # the statistics. Before, the server's one thread was in the streamer: none came.
        socket.connect(server.control)
        client_id = f"{os.getpid()}-control-waits"
        _welcome(socket, Hello(client_id=client_id))
        _welcome(socket, Heartbeat(sender_id=client_id))
        started = time.monotonic()
        fetch_stats(server.control, timeout=ANSWER_WITHIN)
        assert time.monotonic() - started < ANSWER_WITHIN
        # And all along: 100 calls of `feedmux stats`, the long sample and 50 ms ones.
        for _ in range(100):
            stats = fetch_stats(server.control, timeout=ANSWER_WITHIN)
        assert stats["samples_sent"] > 0
    finally:
        stop.set()
        socket.close()
        context.term()
    assert trainer.join(timeout=30) > 0
