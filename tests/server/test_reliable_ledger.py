"""Reliable delivery's bookkeeping (credit, unacknowledged messages, re-deals): no sockets."""

from __future__ import annotations

import numpy as np

from feedmux.protocol import Ack, Credit, Data, encode, read_tags
from feedmux.server._delivery.reliable import Credits


def message(tag: int, size: int = 1) -> list[object]:
    """A data message of ``size`` samples at positions ``tag * 10 + i`` of epoch 1."""
    tags = np.array([[1, tag * 10 + i] for i in range(size)])
    return list(encode(Data(tags, [f"s{tag}.{i}" for i in range(size)])))


def deliver(credits: Credits, identity: bytes, frames: list[object]) -> int:
    return credits.sent("", identity, frames)


def pick(credits: Credits, skip: list[bytes] | None = None) -> bytes | None:
    """The trainer the next message goes to (the first candidate), or None."""
    candidates = credits.candidates(skip=skip or [])
    return candidates[0][0] if candidates else None


def test_the_trainer_with_the_most_credit_gets_the_next_message() -> None:
    credits = Credits()
    assert pick(credits) is None
    credits.take(b"a", Credit(client_id="a", credits=2))
    credits.take(b"b", Credit(client_id="b", credits=3))
    assert pick(credits) == b"b"
    deliver(credits, b"b", message(1))
    deliver(credits, b"b", message(2))
    assert pick(credits) == b"a" and pick(credits, skip=[b"a"]) == b"b"
    assert credits.unacknowledged == 2 and credits.next_seq == 3


def test_acknowledged_messages_are_released() -> None:
    credits = Credits()
    credits.take(b"a", Credit(client_id="a", credits=1))
    deliver(credits, b"a", message(1))
    assert pick(credits) is None  # no credit left
    credits.take(b"a", Ack(seqs=[1, 99]))  # an unknown seq is ignored
    assert credits.unacknowledged == 0 and pick(credits) == b"a"


def test_an_earlier_server_process_s_acknowledgement_releases_nothing() -> None:
    # Its sequence numbers start at 1 too: the old process's message 1 is not this one's.
    credits = Credits("server-2")
    credits.take(b"a", Credit(client_id="a", credits=2))
    deliver(credits, b"a", message(1))
    credits.take(b"a", Ack(seqs=[1], client_id="a", server_id="server-1"))
    assert credits.unacknowledged == 1
    credits.take(b"a", Ack(seqs=[1], client_id="a", server_id="server-2"))
    assert credits.unacknowledged == 0
    deliver(credits, b"a", message(2))
    credits.take(b"a", Ack(seqs=[2], client_id="a"))  # a loader that names no server
    assert credits.unacknowledged == 0


def test_a_lost_trainer_s_messages_go_to_the_front_in_order() -> None:
    credits = Credits()
    ledger = credits.ledger
    credits.take(b"a", Credit(client_id="a", credits=4))
    credits.take(b"b", Credit(client_id="b", credits=4))
    for tag in (1, 2, 3):
        deliver(credits, b"a", message(tag))
    deliver(credits, b"b", message(9))
    credits.take(b"a", Ack(seqs=[2]))
    credits.lose(b"b")
    credits.lose(b"a")
    credits.lose(b"a")  # twice: counted once
    assert [read_tags(e.frames)[0, 1] for e in ledger.redeal] == [10, 30, 90]
    assert credits.stats() == {"reliable_trainers": 0, "unacknowledged_messages": 3,
                               "resent_messages": 0, "lost_trainers": 2}


def test_only_the_rest_after_the_hand_out_mark_is_dealt_again() -> None:
    credits = Credits("s")
    credits.take(b"a", Credit(client_id="a", credits=4))
    deliver(credits, b"a", message(1, size=3))
    deliver(credits, b"a", message(2, size=2))
    credits.record_mark(Ack(seqs=[1], client_id="a", server_id="s", epoch=1, position=11))
    credits.lose(b"a")
    assert [read_tags(e.frames).tolist() for e in credits.ledger.redeal] == [
        [[1, 12]], [[1, 20], [1, 21]]]


def test_probes_are_paced_by_the_heartbeat_interval() -> None:
    credits = Credits()
    assert credits.beat_due(10.0)
    assert not credits.beat_due(10.5)
    assert credits.beat_due(10.5, force=True)
    assert credits.beat_due(11.6)


def test_a_claimed_credit_is_capped() -> None:
    from feedmux.server._delivery.reliable import MAX_CREDIT

    credits = Credits()
    credits.take(b"a", Credit(client_id="a", credits=2**62))
    assert credits.credit(b"a") == MAX_CREDIT


def test_unacknowledged_bytes_are_capped_across_trainers() -> None:
    from feedmux.server._delivery import reliable

    credits = Credits()
    for name in (b"a", b"b"):
        credits.take(name, Credit(client_id=name.decode(), credits=10))
    frames = message(1)
    deliver(credits, b"a", frames)
    deliver(credits, b"b", frames)
    size = credits.ledger.nbytes // 2
    saved, reliable.MAX_UNACKED_BYTES = reliable.MAX_UNACKED_BYTES, 2 * size
    try:
        assert pick(credits) is None  # credit left, but the bytes held are at the cap
        credits.take(b"a", Ack(seqs=[1]))
        assert pick(credits) == b"a"
        credits.lose(b"b")  # what b held waits to be re-dealt, no longer counted as held
        assert credits.ledger.nbytes == 0 and len(credits.ledger.redeal) == 1
    finally:
        reliable.MAX_UNACKED_BYTES = saved


def test_a_hand_out_mark_counts_only_for_the_sender_s_own_messages() -> None:
    credits = Credits()
    credits.take(b"a", Credit(client_id="a", credits=2))
    deliver(credits, b"a", message(1, size=8))
    # Anyone can reach the control port: a mark naming a's message from another client
    # would cut what is re-sent when a goes.
    credits.record_mark(Ack(seqs=[1], client_id="intruder", epoch=1, position=15))
    [entry] = credits.ledger.entries(b"a")
    assert entry.mark is None
    credits.record_mark(Ack(seqs=[1], client_id="a", epoch=1, position=15))
    assert entry.mark == (1, 15)


def test_messages_handed_out_whole_are_acknowledged_over_control_by_their_holder() -> None:
    credits = Credits("server-1")
    credits.take(b"a", Credit(client_id="a", credits=3))
    for tag in (1, 2, 3):
        deliver(credits, b"a", message(tag))
    # No position: the messages were handed out whole (the trainer's thread says so for
    # those its loader had not acknowledged yet) -- but only the holder's own count, and
    # only those this server dealt (a trainer's previous server numbered its own).
    credits.record_mark(Ack(seqs=[1, 2], client_id="intruder", server_id="server-1"))
    credits.record_mark(Ack(seqs=[1, 2], client_id="a", server_id="an-earlier-server"))
    assert [e.seq for e in credits.ledger.entries(b"a")] == [1, 2, 3]
    credits.record_mark(Ack(seqs=[1, 2], client_id="a", server_id="server-1"))
    assert [e.seq for e in credits.ledger.entries(b"a")] == [3] and pick(credits) == b"a"
    credits.take(b"a", Ack(seqs=[2, 3]))  # the data socket's acknowledgement of 2 as well
    assert credits.unacknowledged == 0 and credits.ledger.nbytes == 0
