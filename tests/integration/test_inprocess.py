"""``--workers auto`` at a count of one samples in the server's own process.

No worker process runs then (the zygote does, to fork them when more are
wanted); a change of the count moves the shards to forked workers and back as any
move does, so the seeded sequence is ``--workers 1``'s through the changes, and
control is answered while the server's own draw is slow.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from feedmux.client.remote import RemoteLoader, fetch_stats
from feedmux.server.server import Server
from tests.integration.conftest import CheckedThread, wait_until, worker_pids, zygote_pid
from tests.integration.hard_samplers import LONG_SAMPLE_LINE
from tests.integration.test_autoscale import NUMBERED, Row, consume
from tests.integration.test_control_waits import ANSWER_WITHIN
from tests.integration.test_shm_workers import views_of_two_epochs

pytestmark = pytest.mark.timeout(240)

STREAMS, PER_STREAM, EPOCHS = 12, 60, 4


def command(delay: float, *args: str) -> tuple[str, ...]:
    # 12 streams over 6 shards, each sample ``delay`` s of waiting.
    return (NUMBERED, "--arg", f"streams={STREAMS}", "--arg", f"per_stream={PER_STREAM}",
            "--arg", f"delay={delay}", "--epochs", str(EPOCHS), "--seed", "5",
            "--samples-per-message", "4", *args)


def assert_exact(rows: list[Row]) -> None:
    per_epoch = STREAMS * PER_STREAM
    for epoch in range(1, EPOCHS + 1):
        got = sorted(row[2] for row in rows if row[0] == epoch)
        assert got == list(range(per_epoch)), f"epoch {epoch}: samples lost or repeated"


def sampling_here(server: Any) -> bool:
    """Whether the server samples in its own process, with no worker process running."""
    stats = fetch_stats(server.control, timeout=5)
    return bool(stats["sampling_in_server"] == 1 and stats["workers"] == 1
                and not worker_pids(server.pid))


def test_auto_at_one_runs_no_worker_process_and_gives_the_sequence_of_workers_1(
        serve: Any) -> None:
    reference = consume(serve(*command(0.0005, "--workers", "1")))
    server = serve(*command(0.0005, "--workers", "auto:1-4"))
    wait_until(lambda: zygote_pid(server.pid) is not None, 10, "the zygote")
    assert sampling_here(server)
    trainer = CheckedThread(consume, server)
    wait_until(lambda: fetch_stats(server.control, timeout=5)["samples_sent"] > 0, 30,
               "the first samples sent")
    stats = fetch_stats(server.control, timeout=5)
    # Unless auto grew meanwhile (the trainer waited for a sampling of 0.5 ms a
    # sample), nothing was forked: the server's process sampled every sample so far.
    if stats["worker_changes"] == 0:
        assert stats["workers_started"] == 0 and sampling_here(server), stats
    rows = trainer.join(120)
    assert server.wait(timeout=60) == 0
    assert_exact(rows)
    assert rows == reference, "auto at one gave another sequence than --workers 1"
    assert "1 sampling process: the server's own" in server.stderr


def _scale(spawn: Any, control: str, workers: str) -> None:
    scale = spawn("scale", control, workers, "--timeout", "15")
    assert scale.wait(timeout=30) == 0, scale.stderr


def test_scale_2_then_1_moves_the_shards_out_and_back_exactly(serve: Any, spawn: Any) -> None:
    # 5 ms a sample: the stream lasts about 15 s in one process (the sampler runs ahead of
    # the trainer by the groups' buffer), long enough for both moves and the commands that
    # ask for them (a process each) on a loaded machine; at 2 ms the stream once ended
    # before the second command came.
    reference = consume(serve(*command(0.005, "--workers", "1")))
    server = serve(*command(0.005, "--workers", "auto:1-4"))
    trainer = CheckedThread(consume, server)
    sent = lambda: int(fetch_stats(server.control, timeout=5)["samples_sent"])  # noqa: E731
    wait_until(lambda: sent() > 100, 30, "samples sent from the server's process")
    _scale(spawn, server.control, "2")
    wait_until(lambda: len(worker_pids(server.pid)) == 2, 10, "two worker processes")
    stats = fetch_stats(server.control, timeout=5)
    assert stats["sampling_in_server"] == 0 and stats["workers"] == 2, stats
    before = sent()
    wait_until(lambda: sent() > before + 100, 30, "samples sent from the workers")
    _scale(spawn, server.control, "1")
    wait_until(lambda: sampling_here(server), 10, "sampling back in the server's process")
    before = sent()
    wait_until(lambda: sent() > before + 100, 30, "samples sent from the server again")
    assert fetch_stats(server.control, timeout=5)["epoch"] <= EPOCHS  # still serving
    rows = trainer.join(120)
    assert server.wait(timeout=60) == 0
    assert_exact(rows)
    assert rows == reference, "the moves changed the sequence"
    assert "the server samples in its own process" in server.stderr


def test_control_is_answered_while_the_servers_own_draw_is_slow(serve: Any) -> None:
    # 20 ms of pure Python a sample, and one sample of 4 s, drawn in the server's process.
    server = serve("tests.integration.hard_samplers:gil_bound", "--arg", "ms=20", "--arg",
                   "long_at=20", "--arg", "long_s=4", "--workers", "auto:1-2")
    stop = threading.Event()

    def read() -> int:
        count = 0
        with RemoteLoader(server.data, control=server.control, timeout=30) as loader:
            for _ in loader:
                count += 1
                if stop.is_set():
                    return count
        return count

    trainer = CheckedThread(read)
    try:
        server.wait_for_stderr(lambda text: LONG_SAMPLE_LINE in text, 30,
                               "the streamer's long sample")
        answers = []
        for _ in range(5):  # within the long sample (4 s)
            started = time.monotonic()
            stats = fetch_stats(server.control, timeout=ANSWER_WITHIN)
            answers.append(time.monotonic() - started)
            assert stats["sampling_in_server"] == 1 and not worker_pids(server.pid), stats
        assert max(answers) < ANSWER_WITHIN, answers
    finally:
        stop.set()
    assert trainer.join(60) > 0
    server.kill()


def test_auto_at_one_draws_into_the_pool_and_the_trainer_gets_views() -> None:
    # 1 MiB samples whose values are their id: the server's own draws copy each array
    # into the shared-memory pool once (as --workers 1 does), and the trainer maps it.
    server = Server("tests.integration.samplers:large", bind="tcp://127.0.0.1:0", epochs=2,
                    samples_per_message=1, shm_size=256 << 20, workers="auto:1-2",
                    seed=3).start()
    try:
        def at_one(stats: dict[str, Any]) -> None:
            if stats["worker_changes"] == 0:
                assert stats["sampling_in_server"] == 1, stats

        copied_at = views_of_two_epochs(server, at_one)
        # Drawn with the trainer mapping the pool: every array was copied into it as it
        # was drawn, so the server copied none when it sent them.
        assert copied_at["end"] == copied_at["start"]
        assert server.join(30) == 0
    finally:
        server.stop()
