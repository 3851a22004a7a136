"""A free reliable trainer's liveness: lost when its connection closes or after a silence,
never for a pause of the link or of the server itself (a fake outbox and clock, no sockets)."""

from __future__ import annotations

from feedmux.protocol import Ack, Credit
from feedmux.server._delivery.outbox import GONE
from feedmux.server._delivery.reliable import HEARTBEAT_INTERVAL, SILENCE_GRACE, ReliableLink
from tests.server.test_dealer import FakeOutbox, NoSocket, message


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def two_trainers() -> tuple[ReliableLink, FakeOutbox, Clock]:
    """Trainers a and b with credit; a holds message 1 (positions 0 and 1), nothing handed out."""
    clock, outbox = Clock(), FakeOutbox()
    link = ReliableLink(NoSocket(), outbox, "s", clock=clock)  # type: ignore[arg-type]
    for identity, client in ((b"za", "a"), (b"zb", "b")):
        link.credits.take(identity, Credit(client_id=client, credits=4))
    link.credits.sent("", b"za", message(0, 1))
    link.turn()
    return link, outbox, clock


def pass_time(link: ReliableLink, clock: Clock, seconds: float, *, heard: str = "b") -> None:
    """``seconds`` of the server dealing (a turn every 0.25 s); ``heard`` signs of life
    from that trainer every heartbeat interval meanwhile."""
    end, last = clock.now + seconds, clock.now
    while clock.now < end:
        clock.now += 0.25
        if heard and clock.now - last >= HEARTBEAT_INTERVAL:
            link.marked(Ack(client_id=heard))
            last = clock.now
        link.turn()


def test_a_silent_trainer_is_lost_after_the_grace_and_its_messages_go_to_the_others() -> None:
    link, _, clock = two_trainers()
    pass_time(link, clock, SILENCE_GRACE - 1)  # a link down a while: a pause, not a loss
    assert link.credits.stats()["lost_trainers"] == 0 and not link.credits.ledger.redeal
    pass_time(link, clock, 2)
    assert link.credits.stats()["lost_trainers"] == 1 and b"za" not in link.credits.peers
    assert [entry.seq for entry in link.credits.ledger.redeal] == [1]
    assert b"zb" in link.credits.peers  # heard all along


def test_a_trainer_heard_over_control_keeps_its_messages_however_long() -> None:
    link, _, clock = two_trainers()
    for _ in range(3):
        pass_time(link, clock, SILENCE_GRACE - 1, heard="a")
    assert b"za" in link.credits.peers and link.credits.count(b"za") == 1  # (b fell silent)


def test_a_closed_connection_loses_a_trainer_at_the_next_heartbeat() -> None:
    link, outbox, clock = two_trainers()
    outbox.answers = {b"za": GONE}
    pass_time(link, clock, HEARTBEAT_INTERVAL + 0.25, heard="a")
    assert link.credits.stats()["lost_trainers"] == 1


def test_time_the_server_itself_did_not_look_is_no_silence() -> None:
    link, _, clock = two_trainers()
    clock.now += 3 * SILENCE_GRACE  # a draw that took long: nothing was read meanwhile
    link.turn()
    assert link.credits.stats()["lost_trainers"] == 0
    pass_time(link, clock, SILENCE_GRACE + 2)  # listening again: a's silence counts now
    assert link.credits.stats()["lost_trainers"] == 1


def test_a_mark_in_a_later_message_acknowledges_the_earlier_ones() -> None:
    # The acknowledgements of messages 1 and 2 were lost (the control link was down while
    # the trainer handed them out); its mark in message 3 says they were handed out whole.
    link, _, _ = two_trainers()
    credits = link.credits
    credits.sent("", b"za", message(10, 11))
    credits.sent("", b"za", message(20, 21))
    credits.sent("", b"zb", message(30))
    assert credits.count(b"za") == 3
    link.marked(Ack(seqs=[3], client_id="a", server_id="s", epoch=1, position=20))
    assert [entry.seq for entry in credits.ledger.entries(b"za")] == [3]
    assert credits.count(b"zb") == 1  # another trainer's messages are its own
    credits.lose(b"za")  # only the rest of message 3 goes to the others
    assert [entry.tags.tolist() for entry in credits.ledger.redeal] == [[[1, 21]]]

