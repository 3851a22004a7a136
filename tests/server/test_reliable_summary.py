"""What a reliable server sends outside credit: a trainer that reads nothing is sent
at most SUMMARY_BACKLOG summaries, and the newest one once it reads again."""

from __future__ import annotations

import numpy as np

from feedmux.protocol import Data, decode, encode, unpack_envelope
from feedmux.server._delivery.ledger import Ledger, Recovery
from feedmux.server._delivery.reliable import SUMMARY_BACKLOG, SUMMARY_INTERVAL, HandOutSummary

PAUSED, READING = b"paused", b"reading"


def deal(summary: HandOutSummary, ledger: Ledger, seq: int) -> None:
    """The server deals its ``seq``-th message (epoch 1, ten positions) to READING."""
    tags = np.array([[1, 10 * seq + n] for n in range(10)])
    frames = list(encode(Data(tags, list(range(10)))))
    ledger.record(READING, READING, frames, seq)
    summary.dealt(frames)


def send_due(summary: HandOutSummary, ledger: Ledger, now: float) -> dict[bytes, tuple[int, ...]]:
    """What the server's summarize step sends each trainer at ``now``."""
    frames = summary.due(now, ledger, "server")
    sent = {}
    for identity in (PAUSED, READING):
        if frames is not None and summary.wants(identity):
            summary.sent(identity)
            sent[identity] = decode(unpack_envelope(frames)[1]).handed_below
    return sent


def test_a_trainer_that_reads_nothing_is_sent_a_bounded_backlog_then_the_newest() -> None:
    summary, ledger = HandOutSummary(), Ledger(Recovery.REDEAL)
    to_paused = []
    now = 0.0
    for seq in range(1, 4 * SUMMARY_BACKLOG):
        deal(summary, ledger, seq)
        ledger.acknowledge(READING, [seq - 1])
        now += SUMMARY_INTERVAL
        sent = send_due(summary, ledger, now)
        assert READING in sent, f"the reading trainer missed summary {seq}"
        summary.read(READING)  # it acknowledges, or its loader's heartbeat comes
        if PAUSED in sent:
            to_paused.append(sent[PAUSED])
    assert len(to_paused) == SUMMARY_BACKLOG
    # Nothing new and nothing repeated while it stays behind, even when due.
    assert send_due(summary, ledger, now + SUMMARY_INTERVAL) == {}
    summary.read(PAUSED)  # it reads again: it gets the newest summary, once
    sent = send_due(summary, ledger, now + 2 * SUMMARY_INTERVAL)
    assert sent == {PAUSED: summary.current} and summary.current != to_paused[-1]
    assert send_due(summary, ledger, now + 3 * SUMMARY_INTERVAL) == {}


def test_a_summary_is_not_due_before_its_interval_nor_before_anything_was_dealt() -> None:
    summary, ledger = HandOutSummary(), Ledger(Recovery.REDEAL)
    assert summary.due(0.0, ledger, "server") is None
    deal(summary, ledger, 1)
    assert summary.due(1.0, ledger, "server") is not None
    assert summary.due(1.0 + SUMMARY_INTERVAL / 2, ledger, "server") is None


def test_what_a_batch_shape_holds_is_listed_as_not_handed_out() -> None:
    # Rows a free trainer's batch shape took and sent to nobody yet lie below the newest
    # message as soon as another trainer takes one: a summary that did not list them would
    # have a restarted server take them for handed out (lost).
    summary, ledger = HandOutSummary(), Ledger(Recovery.REDEAL)
    deal(summary, ledger, 3)
    ledger.acknowledge(READING, [3])
    assert summary.due(0.0, ledger, "server") is not None and summary.current == (1, 40)
    summary.held = lambda: [(1, 20, 27)]
    frames = summary.due(SUMMARY_INTERVAL, ledger, "server")
    assert frames is not None and summary.current == (1, 40, 1, 20, 27)
    assert decode(unpack_envelope(frames)[1]).handed_below == (1, 40, 1, 20, 27)


def test_a_batch_of_earlier_rows_dealt_last_does_not_pull_the_summary_back() -> None:
    # A batch built from a dead trainer's re-dealt rows goes out as a new message behind the
    # furthest one dealt; the summary must still cover up to the furthest, listing what is
    # outstanding below it (else the re-deal queue's positions above the batch are covered
    # by nothing, and a restarted server takes them for handed out).
    summary, ledger = HandOutSummary(), Ledger(Recovery.REDEAL)
    deal(summary, ledger, 3)  # positions 30-39
    ledger.acknowledge(READING, [3])
    batch = list(encode(Data(np.array([[1, 5], [1, 6]]), [5, 6])))
    summary.dealt(batch)
    assert summary.newest == (1, 40)
    summary.held = lambda: [(1, 20, 27)]  # still waiting to be dealt again
    assert summary.due(0.0, ledger, "server") is not None
    assert summary.current == (1, 40, 1, 20, 27)
    summary.dealt(list(encode(Data(np.array([[2, 0]]), [0]))))  # the next epoch's first
    assert summary.newest == (2, 1)
