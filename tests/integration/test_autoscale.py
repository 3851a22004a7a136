"""The order of a seeded run does not depend on how many workers sample it, nor on changes.

Real servers (``feedmux serve``) and trainers over loopback: the same ``--seed`` gives
the same (epoch, position, sample) with any ``--workers``; the worker count changed
while it serves (``feedmux scale``) keeps every epoch exact.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from feedmux.client._endpoints import request_scale
from feedmux.client.remote import RemoteLoader, fetch_stats
from feedmux.errors import TransportTimeoutError
from feedmux.server.server import Server
from tests.integration import test_resume as resume
from tests.integration.conftest import CheckedThread, wait_until, worker_pids, zygote_pid

pytestmark = pytest.mark.timeout(240)

SOURCE = "tests.integration.samplers:augmented"
STREAMS, PER_STREAM = 12, 25  # 12 streams, 2 active: 6 shards
IDS = STREAMS * PER_STREAM

Record = tuple[int, int, int, float, float]


def sequence(serve: Any, epochs: int, *args: str) -> tuple[list[Record], str]:
    """Every sample of ``epochs`` epochs by (epoch, position), with its draws, and stderr."""
    server = serve(SOURCE, "--arg", f"streams={STREAMS}", "--arg", f"per_stream={PER_STREAM}",
                   "--epochs", str(epochs), "--seed", "11", *args)
    records: list[Record] = []
    with RemoteLoader(server.data, control=server.control, timeout=60,
                      with_meta=True) as loader:
        for meta, sample in loader:
            records.append((meta.epoch, meta.position, int(sample["id"]),
                            float(sample["noise"]), float(sample["py"])))
    assert server.wait(timeout=60) == 0
    records.sort()
    for epoch in range(1, epochs + 1):
        ids = [record[2] for record in records if record[0] == epoch]
        assert sorted(ids) == list(range(IDS)), f"epoch {epoch} is not every sample once"
    return records, server.stderr


def test_the_same_seed_gives_the_same_sequence_with_1_2_3_5_and_auto_workers(
        serve: Any) -> None:
    one, log = sequence(serve, 3, "--workers", "1")
    assert re.search(r"6 shard\(s\) \(12 streamers, at least 2 per shard", log), log
    for workers in ("3", "2", "5", "auto:1-6"):
        other, _ = sequence(serve, 3, "--workers", str(workers))
        assert other == one, f"--workers {workers} gave another sequence than --workers 1"
    orders = [[record[2] for record in one if record[0] == epoch] for epoch in (1, 2, 3)]
    assert len({tuple(order) for order in orders}) == 3, "every epoch has its own order"


NUMBERED = "tests.integration.samplers:numbered"
LIVE_STREAMS, LIVE_PER_STREAM, LIVE_EPOCHS = 12, 60, 5
Row = tuple[int, int, int]  # (epoch, position, id)


def live_command(*args: str) -> tuple[str, ...]:
    # 1 ms a sample: an epoch (720 samples) spans several changes every 0.5 s.
    return (NUMBERED, "--arg", f"streams={LIVE_STREAMS}", "--arg",
            f"per_stream={LIVE_PER_STREAM}", "--arg", "delay=0.001", "--epochs",
            str(LIVE_EPOCHS), "--seed", "3", "--samples-per-message", "4", *args)


def consume(server: Any, rank: int | None = None, world_size: int | None = None,
            slow_until: threading.Event | None = None) -> list[Row]:
    """Every row a loader gets; with ``slow_until``, 5 ms a row until that event is set
    (the server's loop keeps turning, and the stream lasts at least 18 s meanwhile)."""
    rows: list[Row] = []
    ranked = {} if rank is None else {"rank": rank, "world_size": world_size}
    with RemoteLoader(server.data, control=server.control, timeout=60, with_meta=True,
                      **ranked) as loader:
        for meta, sample in loader:
            rows.append((meta.epoch, meta.position, int(sample["id"])))
            if slow_until is not None and not slow_until.is_set():
                time.sleep(0.005)  # a slow trainer's step, not a wait for a condition
    return rows


def trainers(server: Any, ranked: bool) -> list[Row]:
    """Every row the trainers got: one free trainer, or two ranks of a job."""
    if not ranked:
        return consume(server)
    threads = [CheckedThread(consume, server, rank, 2) for rank in range(2)]
    return sorted(row for thread in threads for row in thread.join(180))


def workers_of(server: Any) -> list[int]:
    """The server's sampling processes (its zygote's children), from /proc."""
    return worker_pids(server.pid)


def assert_exact(rows: list[Row]) -> None:
    per_epoch = LIVE_STREAMS * LIVE_PER_STREAM
    for epoch in range(1, LIVE_EPOCHS + 1):
        got = sorted(row[2] for row in rows if row[0] == epoch and row[1] < per_epoch)
        assert got == list(range(per_epoch)), f"epoch {epoch}: samples lost or repeated"


class Driver:
    """Asks the server for another worker count every 0.5 s (``feedmux scale``)."""

    def __init__(self, server: Any, counts: list[int], kill_at: int | None = None) -> None:
        self.server, self.counts, self.kill_at = server, counts, kill_at
        self.done = threading.Event()
        self.changes = 0
        self.killed: int | None = None
        self.thread = CheckedThread(self.run)

    def run(self) -> None:
        for step in itertools.count():
            if self.done.is_set() or self.server.returncode is not None:
                return
            try:
                request_scale(self.server.control, self.counts[step % len(self.counts)],
                              timeout=5)
            except TransportTimeoutError:
                return  # the server has ended
            self.changes += 1
            if step == self.kill_at:  # a worker SIGKILLed right after a change
                count = self.counts[step % len(self.counts)]
                # Once the workers asked to end have ended: a worker killed while it ends
                # as asked is no death to hand over.
                wait_until(lambda count=count: len(workers_of(self.server)) == count, 10,
                           f"{count} worker processes")
                pids = workers_of(self.server)
                self.killed = pids[1]
                os.kill(self.killed, signal.SIGKILL)
            self.done.wait(0.5)  # the pace of the changes, not a synchronisation

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


@pytest.mark.parametrize("ranked", [False, True], ids=["free", "ranked"])
def test_exact_epochs_and_the_same_order_while_the_worker_count_changes_every_half_second(
        serve: Any, ranked: bool) -> None:
    reference = trainers(serve(*live_command("--workers", "1")), ranked)
    server = serve(*live_command("--workers", "4"))
    driver = Driver(server, [1, 3, 2, 4])
    try:
        rows = trainers(server, ranked)
    finally:
        driver.stop()
    assert server.wait(timeout=60) == 0
    assert driver.changes >= 4, "the run ended before the count changed a few times"
    assert_exact(rows)
    assert rows == reference, "the order changed with the worker count"
    assert re.search(r"workers \d -> \d: asked for over control", server.stderr)


def test_a_worker_sigkilled_during_a_change_hands_its_shards_over(serve: Any) -> None:
    reference = consume(serve(*live_command("--workers", "1")))
    # Without the shared-memory pool (small samples would not use it anyway); a death
    # with the pool in use: test_shm_workers.py.
    server = serve(*live_command("--workers", "4", "--no-shm"))
    driver = Driver(server, [4, 2, 4, 3], kill_at=2)
    try:
        rows = consume(server)
    finally:
        driver.stop()
    assert server.wait(timeout=60) == 0
    assert driver.killed is not None
    assert f"pid {driver.killed}) exited unexpectedly with code -9; its shards" in server.stderr
    assert_exact(rows)
    assert rows == reference


def test_a_change_of_the_count_forks_or_ends_worker_processes_mid_epoch_within_2_s(
        serve: Any) -> None:
    # An epoch of 24,000 samples at 3 ms each (72 s of one worker's waiting): each change
    # must show within 2 s as that many worker processes (the zygote's children) running
    # shards, far from the epoch's end.
    server = serve(NUMBERED, "--arg", "streams=12", "--arg", "per_stream=2000", "--arg",
                   "delay=0.003", "--workers", "4", "--seed", "1", "--no-shm")
    done = threading.Event()
    trainer = CheckedThread(count_for, server, 120.0, done.is_set)

    def running(count: int) -> bool:
        stats = fetch_stats(server.control, timeout=5)
        return bool(len(workers_of(server)) == count and stats["workers"] == count
                    and stats["workers_sampling_now"] == count)

    try:
        # Mid-epoch: the changes start once samples flow (before that the statistics'
        # epoch is 0, and a change would not be mid-epoch).
        wait_until(lambda: fetch_stats(server.control, timeout=5)["samples_sent"] > 0, 30,
                   "the first samples sent")
        assert len(workers_of(server)) == 4
        for count in (1, 3, 2, 4, 1):
            request_scale(server.control, count, timeout=10)
            wait_until(partial(running, count), 2.0, f"{count} worker process(es)")
        stats = fetch_stats(server.control, timeout=5)
        assert stats["epoch"] == 1, "the epoch ended before the changes: the test is too slow"
        assert stats["shards_moved"] > 0, stats  # the shards follow the processes
        assert stats["worker_changes"] == 5
        assert stats["workers_started"] == 4 + 2 + 2  # 1 -> 3, 2 -> 4: four more forked
    finally:
        done.set()
    assert trainer.join(90) > 0
    server.kill()


def test_auto_starts_sampling_in_the_server_and_scale_3_makes_three_workers(
        serve: Any) -> None:
    server = serve(*live_command("--workers", "auto"))
    # Before any trainer: auto starts with MIN (1), not with the most it may run, and
    # one is the server's own process (no worker process: the zygote forks them later).
    wait_until(lambda: zygote_pid(server.pid) is not None, 10, "the zygote")
    zygote = zygote_pid(server.pid)
    assert zygote is not None, "no feedmux-zygote under the server"
    stats = fetch_stats(server.control, timeout=5)
    assert stats["workers"] == 1 and stats["sampling_in_server"] == 1, stats
    assert workers_of(server) == []
    # A count asked for while the server waits for its trainers is made at once too.
    request_scale(server.control, 2, timeout=10)
    wait_until(lambda: len(workers_of(server)) == 2, 2.0, "two worker processes")
    trainer = CheckedThread(consume, server)
    request_scale(server.control, 3, timeout=10)
    wait_until(lambda: len(workers_of(server)) == 3, 2.0, "three worker processes")
    stats = fetch_stats(server.control, timeout=5)
    assert stats["workers"] == 3 and stats["zygote_alive"] == 1
    assert sorted(stats[f"worker.{seat}.pid"] for seat in range(3)) == workers_of(server)
    # The zygote holds one thread and no ZeroMQ context (a context has I/O threads).
    assert len(os.listdir(f"/proc/{zygote}/task")) == 1
    assert_exact(trainer.join(120))
    assert server.wait(timeout=60) == 0


def test_feedmux_scale_asks_and_refuses_clearly(serve: Any, spawn: Any) -> None:
    server = serve(*live_command("--workers", "auto:1-3"))
    # The count changes while it serves; the trainer reads slowly until the stats were
    # read, so that the stream cannot end (and the server exit) first: on a loaded machine
    # the two CLI processes took longer to start than the whole stream at full speed.
    asked = threading.Event()
    trainer = CheckedThread(consume, server, None, None, asked)
    answer = spawn("scale", server.control, "2", "--timeout", "15")
    assert answer.wait(timeout=30) == 0
    assert f"ok: {server.control} asked to run 2 worker(s)" in answer.stdout
    bad = spawn("scale", server.control, "-1")
    assert bad.wait(timeout=30) == 2
    assert "expected an integer >= 0" in bad.stderr
    server.wait_for_stderr(lambda text: "asked for over control" in text, 30, "the change")
    stats = fetch_stats(server.control, timeout=5)
    assert stats["workers"] == 2 and stats["worker_changes"] >= 1
    assert stats["worker_change_reason"] == "asked for over control (feedmux scale)"
    asked.set()
    assert_exact(trainer.join(120))
    assert server.wait(timeout=60) == 0


def test_a_job_checkpointed_with_3_workers_resumes_exactly_with_1(
        serve: Any, tmp_path: Path) -> None:
    job = resume.Job(tmp_path)
    command = (resume.SAMPLER, "--arg", f"per_stream={resume.PER_STREAM}", "--arg",
               "streams=6", "--arg", "n_active=1", "--epochs", str(resume.EPOCHS),
               "--samples-per-message", "8", "--shards", "6")
    try:
        uninterrupted = job.run(serve(*command, "--workers", "1"), "whole", 2)
        server = serve(*command, "--workers", "3")
        crashed = job.crash(server, "crashed", 2)
        server.kill()
        server = serve(*command, "--workers", "1")
        resumed = job.run(server, "resumed", 2, "--resume", str(tmp_path / "state{rank}.json"))
        for rank in range(2):
            assert resume.until_checkpoint(crashed[rank]) + resumed[rank] == uninterrupted[rank], (
                f"rank {rank}: resumed with 1 worker, not the run of 1 worker")
        assert server.wait(timeout=30) == 0
    finally:
        job.close()


def test_auto_adds_workers_to_a_sampler_that_waits_on_storage(serve: Any) -> None:
    # 3 ms of waiting a sample, little CPU: one worker cannot keep a trainer fed. An older
    # trainer (its heartbeats carry no wait): the data path's waits stand in for its own.
    server = serve(NUMBERED, "--arg", "streams=12", "--arg", "per_stream=2000", "--arg",
                   "delay=0.003", "--workers", "auto:1-4", "--seed", "1")
    trainer = CheckedThread(partial(count_for, reports=False), server, 60.0,
                            lambda: grown(server))
    text = server.wait_for_stderr(lambda log: "workers 1 -> 2: " in log, 60, "a first growth")
    assert re.search(r"workers 1 -> 2: the data path never waited for trainers of the last "
                     r"1 s, workers busy \d+%", text), text
    wait_until(lambda: grown(server), 60, "a second worker in the statistics")
    assert fetch_stats(server.control, timeout=5)["trainers_wait_fraction"] is None
    assert trainer.join(90) > 0
    server.kill()


def test_the_trainers_reported_wait_is_shown_and_quoted_when_workers_are_added(
        serve: Any, spawn: Any) -> None:
    server = serve(NUMBERED, "--arg", "streams=12", "--arg", "per_stream=2000", "--arg",
                   "delay=0.003", "--workers", "auto:1-3", "--seed", "1")
    done = threading.Event()
    trainer = CheckedThread(partial(count_for, client_id="reader"), server, 120.0,
                            done.is_set)
    try:
        text = server.wait_for_stderr(lambda log: bool(re.search("workers 1 -> [23]: ", log)),
                                      60,
                                      "a first growth")
        quoted = re.search(r"workers 1 -> [23]: trainers waited (\d+)% of the last 1 s, "
                           r"workers busy \d+%", text)
        assert quoted is not None and int(quoted[1]) >= 5, text
        print(quoted[0])
        seen: dict[str, Any] = {}

        def reported() -> bool:
            seen.update(fetch_stats(server.control, timeout=5))
            return (seen.get("trainer.reader.wait_fraction") or 0.0) > 0.0
        wait_until(reported, 30, "the trainer's reported wait in the statistics")
        print(f"reported: {seen['trainer.reader.wait_fraction']}")
        assert seen["trainers_wait_fraction"] > 0 and seen["trainers_reporting_wait"] == 1
        assert seen["worker_change_reason"].startswith("trainers waited")
        top = spawn("top", server.control, "--count", "1")
        assert top.wait(timeout=60) == 0
        assert re.search(r"trainers waited \d+% \(mean of 1", top.stdout), top.stdout
        assert re.search(r"trainer reader: .*, waits \d+%", top.stdout), top.stdout
    finally:
        done.set()
    assert trainer.join(90) > 0
    server.kill()


def test_a_trainer_that_takes_its_time_reports_a_low_wait_and_gets_no_more_workers(
        serve: Any) -> None:
    # A sampler far faster than a trainer that spends 5 ms on each sample.
    server = serve(NUMBERED, "--arg", "streams=12", "--arg", "per_stream=2000",
                   "--workers", "auto:1-3", "--seed", "1")
    done = threading.Event()
    trainer = CheckedThread(partial(count_for, client_id="sleeper", step=0.005), server,
                            120.0, done.is_set)
    readings: list[tuple[float, float, int]] = []  # (uptime, its wait, workers)

    def three_readings_a_second_apart() -> bool:
        stats = fetch_stats(server.control, timeout=5)
        wait = stats.get("trainer.sleeper.wait_fraction")
        if wait is not None and (not readings or stats["uptime_s"] - readings[-1][0] >= 1.0):
            readings.append((stats["uptime_s"], wait, stats["workers"]))
        return len(readings) >= 3
    try:
        wait_until(three_readings_a_second_apart, 60, "three reports of the trainer's wait")
    finally:
        done.set()
    print(f"the trainer's reported waits: {readings}")
    assert sorted(wait for _, wait, _ in readings)[1] < 0.2, readings  # the median: low
    assert all(workers == 1 for _, _, workers in readings), readings
    assert "workers 1 -> " not in server.stderr, server.stderr
    assert trainer.join(90) > 0
    server.kill()


def grown(server: Any) -> bool:
    stats = fetch_stats(server.control, timeout=5)
    return bool(stats["workers"] >= 2 and stats["worker_changes"] >= 1
                and stats["workers_auto"] == 1)


def count_for(server: Any, seconds: float, done: Any, *, step: float = 0.0,
              reports: bool = True, client_id: str | None = None) -> int:
    """Samples a trainer takes until ``done()`` (checked every 200 samples, or every 20
    with a ``step``: seconds of work on each sample), at most ``seconds``. ``reports``
    False: an older trainer, whose heartbeats carry no wait fraction."""
    taken = 0
    deadline = time.monotonic() + seconds
    with RemoteLoader(server.data, control=server.control, timeout=30,
                      client_id=client_id) as loader:
        if not reports:
            loader._links.wait_share = lambda now, waiting_from: None
        for _ in loader:
            taken += 1
            if step:
                time.sleep(step)  # the trainer's work on a sample, not a synchronisation
            if taken % (20 if step else 200) == 0 and (done() or time.monotonic() > deadline):
                return taken
    return taken


def test_the_metrics_show_the_running_workers_and_count_the_changes() -> None:
    pytest.importorskip("prometheus_client")
    from tests.integration.test_metrics import scrape

    server = Server(NUMBERED, factory_kwargs={"streams": 8, "per_stream": 5000,
                                              "delay": 0.001},
                    bind="tcp://127.0.0.1:0", workers="auto:1-3", seed=2,
                    metrics_port=0).start()
    try:
        assert server.metrics_address is not None
        address = server.metrics_address
        trainer = CheckedThread(count_for, server_view(server), 60.0,
                                lambda: scrape(address)["feedmux_worker_changes_total"] >= 1)
        request_scale(server.control_address, 3, timeout=10)
        wait_until(lambda: scrape(address)["feedmux_workers"] == 3, 30, "3 workers running")
        assert scrape(address)["feedmux_worker_changes_total"] >= 1
        assert trainer.join(90) > 0
    finally:
        assert server.stop() is not None


def server_view(server: Any) -> Any:
    """An in-process Server as count_for reads it (data, control)."""
    return type("View", (), {"data": server.data_address, "control": server.control_address})
