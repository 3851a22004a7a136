"""Many trainers on one server: 64 ranks, 256 free trainers, and the statistics at that scale.

The trainers are threads in a few processes (``benchmarks.bench_scale``: each
thread a loader with its own sockets and client id, so the server sees as many
trainers as there are threads). Every run is bounded: the trainers' own
timeouts, the processes joined with a deadline and killed by pid after it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from benchmarks.bench_scale import Job, Trainers, start_server
from feedmux import Server, fetch_stats
from feedmux._plumbing.sockets import CONTROL_FRAME_BYTES
from feedmux.apps.top import describe
from feedmux.errors import TransportTimeoutError
from feedmux.protocol import Heartbeat, Hello, encode
from tests.integration.conftest import ROOT, CheckedThread, wait_until

#: 64 ranks (8 hosts x 8 GPUs); an epoch no rank count divides.
RANKS = 64
RANKED_EPOCH = RANKS * 10 + 5
EPOCHS = 2


def run_to_the_end(server: Server, job: Job, watch: Any = None) -> list[Any]:
    """Start the trainers, call ``watch()`` while they run, wait for the end; their records."""
    trainers = Trainers(job)
    try:
        if watch is not None:
            watch()
        assert trainers.join(timeout=240), "the trainers did not end within 240 s"
        assert server.join(timeout=60) == 0
    finally:
        trainers.stop(timeout=5)
        server.stop()
    records = trainers.records()
    assert [record.error for record in records if record.error] == []
    assert len(records) == job.trainers
    return records


def answered(control: str) -> dict[str, Any]:
    """The server's statistics, or none if it did not answer within 10 s (a loaded machine,
    the server busy with the trainers' hellos: the wait around it asks again)."""
    try:
        return fetch_stats(control, timeout=10)
    except TransportTimeoutError:
        return {}


def stats_at_scale(control: str, trainers: int, ranked: bool) -> None:
    """``feedmux stats`` (every page) and ``top``'s view, with every trainer connected."""
    wait_until(lambda: answered(control).get("connected_trainers") == trainers,
               timeout=120, what=f"{trainers} trainers connected")
    stats = fetch_stats(control, timeout=20)
    listed = [key for key in stats if key.endswith(".received_messages")]
    assert len(listed) == trainers
    if ranked:
        assert sorted(v for k, v in stats.items() if k.endswith(".rank")) == list(range(trainers))
    assert stats["control_messages"] > 0 and stats["control_cpu_seconds"] > 0
    lines = describe(control, stats, None)
    assert f"{trainers} trainers ({trainers - 8} more not listed)" in "\n".join(lines)
    assert len(lines) < 20  # the view fits a screen


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_64_ranks_take_equal_steps_and_cover_every_epoch(tmp_path: Path) -> None:
    server = start_server(RANKS, True, epochs=EPOCHS, epoch_size=RANKED_EPOCH, streams=5,
                          per_stream=RANKED_EPOCH // 5)
    job = Job(server.data_address, server.control_address, RANKS, epochs=EPOCHS,
              timeout=120, folder=str(tmp_path))
    records = run_to_the_end(server, job, lambda: stats_at_scale(job.control, RANKS, True))
    steps = -(-RANKED_EPOCH // RANKS)  # "pad": every rank ceil(E / n)
    for record in records:
        assert [len(record.epochs[epoch]) for epoch in range(1, EPOCHS + 1)] == [steps] * EPOCHS
    for epoch in range(1, EPOCHS + 1):
        counts = Counter(i for record in records for i in record.epochs[epoch])
        assert set(counts) == set(range(RANKED_EPOCH)), f"epoch {epoch}: a sample missing"
        assert sum(counts.values()) - RANKED_EPOCH == RANKS * steps - RANKED_EPOCH  # the pad


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_256_free_trainers_hand_out_every_sample_once_per_epoch(
        tmp_path: Path) -> None:
    trainers, epoch = 256, 256 * 12
    server = start_server(trainers, False, epochs=EPOCHS, epoch_size=epoch, streams=8,
                          per_stream=epoch // 8)
    job = Job(server.data_address, server.control_address, trainers, ranked=False,
              epochs=EPOCHS, timeout=120, folder=str(tmp_path))
    # feedmux stats (every page) and top's view with 256 trainers connected, while they read.
    records = run_to_the_end(server, job, lambda: stats_at_scale(job.control, trainers, False))
    for number in range(1, EPOCHS + 1):
        handed = [i for record in records for i in record.epochs.get(number, [])]
        assert sorted(handed) == list(range(epoch)), f"epoch {number}: not every sample once"


# -- statistics past one control frame ---------------------------------------------------------
#: Trainers with the longest client id (1024 characters): about 60 fill a 64 KiB frame.
LONG_ID_TRAINERS = 90


def _long_id_trainers(control: str, ids: list[str], stop: threading.Event) -> None:
    """Raw control sockets that say hello once and beat every 0.5 s until ``stop``."""
    context: zmq.Context[Any] = zmq.Context()
    sockets = []
    try:
        for client_id in ids:
            socket = context.socket(zmq.DEALER)
            socket.linger = 0
            socket.connect(control)
            sockets.append(socket)
            socket.send_multipart(encode(Hello(client_id=client_id, role="trainer")))
        while True:
            for socket, client_id in zip(sockets, ids, strict=True):
                with contextlib.suppress(zmq.Again):  # a busy server: the next beat counts
                    socket.send_multipart(encode(Heartbeat(sender_id=client_id)), zmq.NOBLOCK)
            if stop.wait(0.5):
                return
    finally:
        for socket in sockets:
            socket.close()
        context.term()


@pytest.fixture
def crowded_server() -> Iterator[tuple[Server, list[str]]]:
    """A server with :data:`LONG_ID_TRAINERS` trainers of long client ids, waiting for one
    more (their control sockets only: what the server sends them waits unread)."""
    server = Server("tests.integration.samplers:numbered", bind="tcp://127.0.0.1:0",
                    control="tcp://127.0.0.1:0", min_trainers=LONG_ID_TRAINERS + 1).start()
    ids = [f"{index:04d}".ljust(1024, "t") for index in range(LONG_ID_TRAINERS)]
    stop = threading.Event()
    beating = CheckedThread(_long_id_trainers, server.control_address, ids, stop)
    try:
        yield server, ids
    finally:
        stop.set()
        try:
            beating.join(timeout=10)
        finally:
            server.stop()


@pytest.mark.timeout(120)
def test_stats_and_top_answer_when_the_figures_pass_one_control_frame(
        crowded_server: tuple[Server, list[str]]) -> None:
    server, ids = crowded_server
    wait_until(lambda: fetch_stats(server.control_address, timeout=10)
               .get("connected_trainers") == LONG_ID_TRAINERS, timeout=60,
               what="every trainer connected")
    stats = fetch_stats(server.control_address, timeout=10)
    assert len(json.dumps(stats)) > CONTROL_FRAME_BYTES  # one reply could not carry this
    assert {key for key in stats if key.endswith(".received_messages")} == {
        f"trainer.{client_id}.received_messages" for client_id in ids}
    command = [sys.executable, "-m", "feedmux", "stats", server.control_address,
               "--timeout", "20"]
    printed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    printed_stats = json.loads(printed.stdout)
    assert printed_stats["connected_trainers"] == LONG_ID_TRAINERS, {
        key: value for key, value in printed_stats.items() if "." not in key}
    top = subprocess.run([sys.executable, "-m", "feedmux", "top", server.control_address,
                          "--count", "1", "--timeout", "20"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert f"{LONG_ID_TRAINERS} trainers ({LONG_ID_TRAINERS - 8} more not listed)" in top.stdout
