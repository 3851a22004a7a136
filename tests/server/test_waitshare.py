"""The trainers' reported wait for data, kept by the control core and read for the
autoscaler and the statistics: made-up heartbeats and a made-up clock, no sockets."""

from __future__ import annotations

import pytest

from feedmux.protocol import Heartbeat, Hello
from feedmux.server._control.core import ControlCore
from feedmux.server._control.waitshare import REPORT_AGE, trainers_wait
from feedmux.server.config import ServerConfig


def make_core() -> ControlCore:
    return ControlCore(ServerConfig(source="unused:source", server_id="srv"), started=0.0)


def beat(sender: str, wait: float | None, received: int = 1) -> Heartbeat:
    return Heartbeat(sender_id=sender, received_messages=received, wait_fraction=wait)


def test_the_mean_covers_the_trainers_heard_lately_and_drops_stale_reports() -> None:
    core = make_core()
    for identity, name in ((b"a", "fast"), (b"b", "slow"), (b"c", "old")):
        core.receive(identity, Hello(client_id=name), now=0.0)
    core.receive(b"a", beat("fast", 0.6), now=1.0)
    core.receive(b"b", beat("slow", 0.0), now=1.5)
    core.receive(b"c", beat("old", None), now=1.5)  # an older trainer: no report, not counted
    assert trainers_wait(core.trainers.values(), now=2.0) == pytest.approx(0.3)
    stats = core.stats(now=2.0)
    assert stats["trainers_wait_fraction"] == pytest.approx(0.3)
    assert stats["trainers_reporting_wait"] == 2
    assert stats["trainers_wait_fraction_max"] == pytest.approx(0.6)
    assert stats["trainer.fast.wait_fraction"] == pytest.approx(0.6)
    assert stats["trainer.slow.wait_fraction"] == 0.0
    assert "trainer.old.wait_fraction" not in stats
    # "fast" goes silent: once its report is older than REPORT_AGE it no longer counts,
    # while "slow" keeps reporting.
    later = 1.0 + REPORT_AGE + 0.1
    core.receive(b"b", beat("slow", 0.1), now=later - 0.5)
    assert trainers_wait(core.trainers.values(), now=later) == pytest.approx(0.1)
    assert "trainer.fast.wait_fraction" not in core.stats(now=later)
    # Nobody reports any more: None, and the decision falls back to the data path's waits.
    assert trainers_wait(core.trainers.values(), now=later + REPORT_AGE) is None
    assert core.stats(now=later + REPORT_AGE)["trainers_wait_fraction"] is None


def test_a_heartbeat_without_a_report_leaves_the_last_one_and_a_gone_trainer_counts_no_more(
        ) -> None:
    core = make_core()
    core.receive(b"a", Hello(client_id="t"), now=0.0)
    core.receive(b"b", Hello(client_id="u"), now=0.0)
    core.receive(b"a", beat("t", 0.5), now=1.0)
    core.receive(b"b", beat("u", 0.1), now=1.0)
    core.receive(b"a", beat("t", None, received=7), now=1.2)  # e.g. a drain's answer
    assert core.trainers[b"a"].received_messages == 7
    assert trainers_wait(core.trainers.values(), now=1.5) == pytest.approx(0.3)
    core.peer_gone(b"a")  # a failed send: the trainer is forgotten, its report with it
    assert trainers_wait(core.trainers.values(), now=1.5) == pytest.approx(0.1)


def test_an_old_heartbeat_is_still_a_sign_of_life() -> None:
    core = make_core()
    core.receive(b"a", Hello(client_id="t"), now=0.0)
    [(_, welcome)] = core.receive(b"a", Heartbeat(sender_id="t", received_messages=3), now=1.0)
    assert welcome.server_id == "srv"  # type: ignore[union-attr]
    assert core.trainers[b"a"].last_seen == 1.0 and core.trainers[b"a"].wait is None
