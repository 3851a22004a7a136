"""The acknowledging thread's pace: about one mark per message, and the last word at close."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import zmq

from feedmux.client._acks import (
    ACK_INTERVAL,
    MARK_INTERVAL,
    MAX_ACK_INTERVAL,
    NEW_MESSAGE_INTERVAL,
    AckPace,
    HandOutAcks,
)
from feedmux.protocol import Ack, decode


def test_idle_looks_back_off_and_a_send_brings_the_pace_back() -> None:
    pace = AckPace()
    waits = []
    for _ in range(8):
        pace.looked(sent=False)
        waits.append(pace.wait)
    assert waits[0] == 2 * ACK_INTERVAL and waits[-1] == MAX_ACK_INTERVAL
    assert waits == sorted(waits)
    pace.looked(sent=True)
    assert pace.wait == ACK_INTERVAL


def test_a_loader_with_a_message_every_100_ms_is_looked_at_every_50_not_5() -> None:
    # A trainer of image batches: after each mark the thread looked again at 5, 15, 35 and
    # 75 ms, finding nothing new; each wake-up cost the trainer about 50-120 us of CPU.
    slow, fast = AckPace(), AckPace()
    for index in range(8):
        slow.new_message(0.1 * index)
        fast.new_message(0.001 * index)
    slow.looked(sent=True)
    fast.looked(sent=True)
    assert slow.wait == MAX_ACK_INTERVAL
    assert fast.wait == ACK_INTERVAL  # small messages read fast: the pace as before
    for _ in range(4):
        slow.looked(sent=False)
    assert slow.wait == MAX_ACK_INTERVAL  # never longer: the bound on what a kill loses


def test_a_mark_in_a_new_message_is_coalesced_unless_half_the_credit_waits() -> None:
    pace = AckPace(urgent=4)
    first, second = np.zeros((4, 2)), np.zeros((4, 2))
    assert pace.mark_due(first, now=NEW_MESSAGE_INTERVAL, last_sent=0.0)
    pace.marked(first)
    assert not pace.mark_due(first, now=MARK_INTERVAL / 2, last_sent=0.0)
    assert pace.mark_due(first, now=MARK_INTERVAL, last_sent=0.0)
    # Moved on: with the next ones a little later, at once when half the credit waits.
    assert not pace.mark_due(second, now=0.001, last_sent=0.0, waiting=3)
    assert pace.mark_due(second, now=0.001, last_sent=0.0, waiting=4)
    assert pace.mark_due(second, now=NEW_MESSAGE_INTERVAL, last_sent=0.0)


class Reader:
    """What a loader publishes: its current message's tags and how far it handed out."""

    def __init__(self) -> None:
        self.tags = np.array([[1, position] for position in range(0, 16, 2)], dtype=np.int64)
        self.handed = 0

    def __call__(self) -> tuple[int, str, Any, int, int] | None:
        return (0, "s", self.tags, 0, self.handed) if self.handed else None


def marks(router: zmq.Socket[Any], until: float, most: int = 10_000) -> list[tuple[int, int]]:
    """The (epoch, position) of the marks ``router`` gets before ``until`` (``most``: return
    as soon as that many came)."""
    out: list[tuple[int, int]] = []
    while ((remaining := until - time.monotonic()) > 0 and len(out) < most
           and router.poll(int(remaining * 1000))):
        message = decode(router.recv_multipart()[1:])
        assert isinstance(message, Ack)
        if message.position >= 0:
            out.append((message.epoch, message.position))
    return out


@pytest.mark.timeout(30)
def test_the_last_word_carries_the_mark_moved_just_before_the_close(
        control_router: tuple[zmq.Socket[Any], str]) -> None:
    router, address = control_router
    reader = Reader()
    acks = HandOutAcks([address], client_id="c", rank=0, progress=reader)
    try:
        reader.handed = 1
        assert marks(router, time.monotonic() + 10, most=1) == [(1, 0)]
        # Two more samples of the same message, then the close at once: well within
        # MARK_INTERVAL, so only the last word can tell the server.
        reader.handed = 3
        acks.stop()
        assert not acks._thread.is_alive()
        assert marks(router, time.monotonic() + 2)[-1:] == [(1, 4)]
    finally:
        acks.stop()


@pytest.mark.timeout(30)
def test_a_loader_reading_within_one_message_is_marked_at_the_interval_not_each_look(
        control_router: tuple[zmq.Socket[Any], str]) -> None:
    router, address = control_router
    reader = Reader()
    reader.tags = np.array([[1, position] for position in range(10_000)], dtype=np.int64)
    acks = HandOutAcks([address], client_id="c", rank=0, progress=reader)
    try:
        started = time.monotonic()
        seconds = 0.6
        while (elapsed := time.monotonic() - started) < seconds:
            reader.handed = 1 + int(elapsed * 1000)  # a sample a millisecond, one message
            time.sleep(0.001)
        got = marks(router, time.monotonic() + 0.3)
        # Every look would be ~120 marks; one per MARK_INTERVAL is ~6 (a loaded machine
        # looks less often, never more).
        assert 1 <= len(got) <= seconds / MARK_INTERVAL + 3, got
        assert got == sorted(got)
    finally:
        acks.stop()
