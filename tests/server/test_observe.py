"""The server's own figures: sampling time and skipped streams, reconnects, epoch progress."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import pytest

import feedmux
from feedmux.protocol import Heartbeat, Hello
from feedmux.sampling import EpochIterator
from feedmux.server._control.core import ControlCore
from feedmux.server._delivery.dealing import RankDealer
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.meters import SamplerMeter, SharedMeters, sampler_stats
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import produce
from feedmux.server.config import ServerConfig

pytestmark = pytest.mark.timeout(10)


def failing_after(n: int) -> Iterator[str]:
    yield from (f"f{i}" for i in range(n))
    raise OSError("disk gone")


def slow(count: int, delay: float) -> Iterator[int]:
    for i in range(count):
        time.sleep(delay)  # the work being measured, not a synchronisation
        yield i


def produce_into(meter: SamplerMeter, streamer: feedmux.Streamer[object], *,
                 skip_errors: bool = False, epochs: int = 2) -> None:
    def send(frames: Frames, n_samples: int, epoch: int) -> bool:
        return True

    produce(EpochIterator(streamer, max_epochs=epochs), send,
            policy=BatchPolicy(samples_per_message=2), server_id="test",
            skip_errors=skip_errors, meter=meter)


def test_the_producer_counts_sampling_time_as_busy() -> None:
    meter = SamplerMeter()
    produce_into(meter, feedmux.Streamer(slow, 10, 0.01), epochs=1)
    assert meter.busy_seconds >= 10 * 0.01  # at least the sleeps inside the sampler


def test_the_producer_counts_every_skipped_stream() -> None:
    meter = SamplerMeter()
    mux = feedmux.ChainMux([feedmux.Streamer(failing_after, 2), "abc"])
    produce_into(meter, mux, skip_errors=True)
    assert meter.errors_skipped == 2  # once per epoch
    top_level = SamplerMeter()
    produce_into(top_level, feedmux.Streamer(failing_after, 3), skip_errors=True)
    assert top_level.errors_skipped == 2


def produce_ranked(meter: SamplerMeter, streamer: feedmux.Streamer[object], *,
                   skip_errors: bool = False, epochs: int = 2) -> dict[int, int]:
    """Produce for two ranks; the samples each rank got."""
    got = {0: 0, 1: 0}

    def send(frames: Frames, n_samples: int, epoch: int, rank: int) -> bool:
        got[rank] += n_samples
        return True

    produce(EpochIterator(streamer, max_epochs=epochs), send,
            policy=BatchPolicy(samples_per_message=2), server_id="test",
            skip_errors=skip_errors, meter=meter, dealer=RankDealer(2, "pad"))
    return got


def test_the_ranked_producer_counts_busy_time_and_skipped_streams() -> None:
    meter = SamplerMeter()
    assert produce_ranked(meter, feedmux.Streamer(slow, 10, 0.01), epochs=1) == {0: 5, 1: 5}
    assert meter.busy_seconds >= 10 * 0.01
    in_mux = SamplerMeter()
    mux = feedmux.ChainMux([feedmux.Streamer(failing_after, 2), "abc"])
    assert produce_ranked(in_mux, mux, skip_errors=True) == {0: 6, 1: 6}  # 5 a round, padded
    assert in_mux.errors_skipped == 2
    top_level = SamplerMeter()
    # 3 samples, then the streamer raises: its epoch ends there, padded to 2 per rank.
    assert produce_ranked(top_level, feedmux.Streamer(failing_after, 3), skip_errors=True) == {
        0: 4, 1: 4}
    assert top_level.errors_skipped == 2


def test_shared_meters_have_one_slot_per_worker_and_sum() -> None:
    shared = SharedMeters(3)
    shared.meters[0].add_busy(1.5)
    shared.meters[2].add_busy(0.5)
    shared.meters[1].skipped()
    assert [m.busy_seconds for m in shared.meters] == [1.5, 0.0, 0.5]
    assert sampler_stats(shared.meters, 2.0) == {
        "sampler_busy_seconds": 2.0, "send_blocked_seconds": 2.0, "errors_skipped": 1}


def make_core(**options: object) -> ControlCore:
    config = ServerConfig(source="unused:source", server_id="srv", **options)  # type: ignore[arg-type]
    return ControlCore(config, started=0.0, pid=1)


def test_a_trainer_back_on_a_new_connection_counts_as_a_reconnect() -> None:
    core = make_core()
    core.receive(b"a", Hello(client_id="t1"), now=0.0)
    core.receive(b"a", Hello(client_id="t1"), now=0.5)  # the same connection: no
    core.receive(b"b", Hello(client_id="t2"), now=0.5)
    assert core.stats(1.0)["reconnects"] == 0
    core.peer_gone(b"a")
    core.receive(b"c", Hello(client_id="t1"), now=2.0)
    # t2 on a new connection while its old one is thought alive: the old one is probed
    # first (its id is held off a second live loader), and the failed probe frees it.
    assert [identity for identity, _ in core.receive(
        b"d", Heartbeat(sender_id="t2", received_messages=3), now=2.0)] == [b"d", b"b"]
    core.peer_gone(b"b")
    core.receive(b"d", Heartbeat(sender_id="t2", received_messages=3), now=2.0)
    stats = core.stats(2.0)
    assert stats["reconnects"] == 2
    assert stats["trainer.t2.received_messages"] == 3


def test_ranked_trainers_have_their_rank_in_the_stats_with_the_ranked_figures() -> None:
    core = make_core()
    assert "world_size" not in core.stats(0.0)  # nothing ranked before a ranked hello
    core.receive(b"a", Hello(client_id="r0", world_size=2, rank=0), now=0.0)
    core.receive(b"b", Hello(client_id="r1", world_size=2, rank=1), now=0.0)
    core.receive(b"b", Heartbeat(sender_id="r1", received_messages=4), now=0.5)
    stats = core.stats(1.0)
    assert (stats["trainer.r0.rank"], stats["trainer.r1.rank"]) == (0, 1)
    assert stats["trainer.r1.received_messages"] == 4
    assert (stats["world_size"], stats["rank_messages_kept"], stats["rank_messages_resent"]) == (
        2, 0, 0)
    free = make_core()
    free.receive(b"a", Hello(client_id="t1"), now=0.0)
    assert "trainer.t1.rank" not in free.stats(0.0) and "world_size" not in free.stats(0.0)


def test_epoch_position_and_the_progress_log_line(caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(epoch_size=100, log_every=1.0)
    core.tick(0.0)
    core.data_sent(10, epoch=1)
    core.data_sent(30, epoch=1)
    assert core.stats(0.5)["epoch_position"] == 40
    core.data_sent(20, epoch=2)
    assert core.stats(0.5)["epoch_position"] == 20
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        core.tick(2.0)  # 60 samples in 2 s: 30 samples/s, 80 to go
    assert "epoch 2 20% (20/100), ETA 3 s" in caplog.text


def test_no_progress_in_the_log_before_the_epoch_size_is_known(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = make_core(log_every=1.0)
    core.tick(0.0)
    core.data_sent(10, epoch=1)
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        core.tick(2.0)
    assert "samples/s" in caplog.text and "ETA" not in caplog.text


def test_the_rate_and_eta_leave_out_the_wait_before_sampling_and_none_come_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that waited 20 s for its trainers, then sent 100 samples a second: the log
    said 5 samples/s and an ETA 20 times too long (the mean since the start)."""
    core = make_core(epoch_size=1000, log_every=10.0)
    for second in range(21):
        core.tick(float(second))  # waiting, and the first log line: no rate, no ETA
    assert core.stats(20.0)["samples_per_second"] is None and core.stats(20.0)["eta_s"] is None
    for tenth in range(1, 51):  # then 100 samples/s for 5 s
        core.data_sent(10, epoch=1)
        core.tick(20.0 + tenth / 10)
    stats = core.stats(25.0)
    assert stats["samples_per_second"] == pytest.approx(100.0, rel=0.06)
    assert stats["eta_s"] == pytest.approx(5.0, rel=0.06)
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        for tenth in range(1, 51):
            core.data_sent(10, epoch=1)
            core.tick(25.0 + tenth / 10)
        core.tick(30.5)  # the rates are looked at every rates.STEP, the log line with them
    assert re.search(r"\b(9[5-9]|10[0-5]) samples/s over the last 10 s", caplog.text), caplog.text
    assert "epoch 1 100% (1000/1000), ETA 0 s" in caplog.text, caplog.text


def test_a_silent_rank_is_a_lost_warning_once_and_a_silent_free_trainer_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rank's loader proves it lives from its own thread: its silence is a loss. A free
    trainer in a long step is silent and well."""
    core = make_core()
    core.receive(b"a", Hello(client_id="r0", world_size=1, rank=0), now=0.0)
    free = make_core()
    free.receive(b"b", Hello(client_id="t1"), now=0.0)
    with caplog.at_level(logging.INFO, logger="feedmux.server"):
        for tenth in range(1, 80):
            core.tick(tenth / 10)
            free.tick(tenth / 10)
    lost = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert lost[0].getMessage().startswith("trainer r0 (rank 0) lost (no heartbeat for 3 s)")
    assert "kept for the next trainer of rank 0" in lost[0].getMessage()
