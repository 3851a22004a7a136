"""The reliable dispatch's bookkeeping (credit, unacknowledged messages, re-sends): no sockets."""

from __future__ import annotations

from feedmux.protocol import Ack, Credit
from feedmux.server._delivery.reliable import ReliableLedger, _Pending


def pending(tag: int) -> _Pending:
    return _Pending(frames=[tag], n_samples=1, epoch=1)


def test_the_trainer_with_the_most_credit_gets_the_next_message() -> None:
    ledger = ReliableLedger()
    assert ledger.pick() is None
    ledger.take(b"a", Credit(client_id="a", credits=2))
    ledger.take(b"b", Credit(client_id="b", credits=3))
    assert ledger.pick() == b"b"
    ledger.delivered(b"b", pending(1))
    ledger.delivered(b"b", pending(2))
    assert ledger.pick() == b"a"
    assert ledger.unacknowledged == 2 and ledger.next_seq == 3


def test_acknowledged_messages_are_released() -> None:
    ledger = ReliableLedger()
    ledger.take(b"a", Credit(client_id="a", credits=1))
    ledger.delivered(b"a", pending(1))
    assert ledger.pick() is None  # no credit left
    ledger.take(b"a", Ack(seqs=[1, 99]))  # an unknown seq is ignored
    assert ledger.unacknowledged == 0 and ledger.pick() == b"a"


def test_a_lost_trainer_s_messages_go_to_the_front_in_order() -> None:
    ledger = ReliableLedger()
    ledger.take(b"a", Credit(client_id="a", credits=4))
    for tag in (1, 2, 3):
        ledger.delivered(b"a", pending(tag))
    ledger.take(b"a", Ack(seqs=[2]))
    ledger.resend.append(pending(9))
    ledger.lose(b"a")
    ledger.lose(b"a")  # twice: counted once
    assert [p.frames for p in ledger.resend] == [[1], [3], [9]]
    assert ledger.stats() == {"reliable_trainers": 0, "unacknowledged_messages": 3,
                              "resent_messages": 0, "lost_trainers": 1}


def test_probes_are_paced_by_the_heartbeat_interval() -> None:
    ledger = ReliableLedger()
    assert ledger.probe_due(10.0)
    assert not ledger.probe_due(10.5)
    assert ledger.probe_due(10.5, force=True)
    assert ledger.probe_due(11.6)


def test_a_claimed_credit_is_capped() -> None:
    from feedmux.server._delivery.reliable import MAX_CREDIT

    ledger = ReliableLedger()
    ledger.take(b"a", Credit(client_id="a", credits=2**62))
    assert ledger.peers[b"a"].credit == MAX_CREDIT


def test_unacknowledged_bytes_are_capped_across_trainers() -> None:
    from feedmux.server._delivery.reliable import MAX_UNACKED_BYTES

    ledger = ReliableLedger()
    for name in (b"a", b"b"):
        ledger.take(name, Credit(client_id=name.decode(), credits=10))
    big = _Pending(frames=[], n_samples=1, epoch=1, nbytes=MAX_UNACKED_BYTES // 2)
    ledger.delivered(b"a", big)
    ledger.delivered(b"b", big)
    assert ledger.pick() is None  # credit left, but the bytes held are at the cap
    ledger.take(b"a", Ack(seqs=[1]))
    assert ledger.pick() == b"a"
    ledger.lose(b"b")  # what b held goes to the re-send queue, no longer counted as held
    assert ledger.unacked_bytes == 0 and len(ledger.resend) == 1


def test_a_hand_out_mark_counts_only_for_the_sender_s_own_messages() -> None:
    ledger = ReliableLedger()
    ledger.take(b"a", Credit(client_id="a", credits=2))
    ledger.delivered(b"a", pending(1))
    # Anyone can reach the control port: a mark naming a's message from another client
    # would cut what is re-sent when a goes.
    ledger.handed(Ack(seqs=[1], client_id="intruder", epoch=1, position=5))
    assert ledger.peers[b"a"].unacked[1].handed is None
    ledger.handed(Ack(seqs=[1], client_id="a", epoch=1, position=5))
    assert ledger.peers[b"a"].unacked[1].handed == (1, 5)


def test_messages_handed_out_whole_are_acknowledged_over_control_by_their_holder() -> None:
    ledger = ReliableLedger("server-1")
    ledger.take(b"a", Credit(client_id="a", credits=3))
    for tag in (1, 2, 3):
        ledger.delivered(b"a", pending(tag))
    # No position: the messages were handed out whole (the trainer's thread says so for
    # those its loader had not acknowledged yet) -- but only the holder's own count, and
    # only those this server dealt (a trainer's previous server numbered its own).
    ledger.handed(Ack(seqs=[1, 2], client_id="intruder", server_id="server-1"))
    ledger.handed(Ack(seqs=[1, 2], client_id="a", server_id="an-earlier-server"))
    assert sorted(ledger.peers[b"a"].unacked) == [1, 2, 3]
    ledger.handed(Ack(seqs=[1, 2], client_id="a", server_id="server-1"))
    assert sorted(ledger.peers[b"a"].unacked) == [3] and ledger.pick() == b"a"
    ledger.take(b"a", Ack(seqs=[2, 3]))  # the data socket's acknowledgement of 2 as well
    assert ledger.unacknowledged == 0 and ledger.unacked_bytes == 0
