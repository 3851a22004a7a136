"""The dealing stage with a fake outbox (no sockets): free audiences, under a policy that
keeps nothing (the dealer's own rules alone) and under the server's, by credit (the
server's or a group's, a lost member's rest re-dealt within its audience), ranks."""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.protocol import (
    Ack,
    Credit,
    Data,
    Heartbeat,
    Hello,
    decode,
    encode,
    read_tags,
    unpack_envelope,
)
from feedmux.server._control.core import ControlCore
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.dealer import Dealer, FreeAudience, RankAudience
from feedmux.server._delivery.ledger import Entry, Ledger, Recovery
from feedmux.server._delivery.outbox import FULL, GONE, SENT, Sent, Wait
from feedmux.server._delivery.reliable import NO_ACK, ReliableFree, ReliableLink
from feedmux.server._delivery.shares import SHARE_WAIT
from feedmux.server.config import ServerConfig


class FakeOutbox:
    """Records each send (heartbeats apart); a target's sends answer as scripted (SENT by
    default)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[Any]]] = []
        self.beats: list[bytes] = []
        self.answers: dict[bytes, Sent] = {}
        self.waits: list[Wait] = []
        self.bytes_sent = 0

    def send(self, target: bytes, parts: Sequence[Any]) -> Sent:
        answer = self.answers.get(target, SENT)
        if answer is SENT and parts[0] == NO_ACK and isinstance(decode(parts[1:]), Heartbeat):
            self.beats.append(target)
        elif answer is SENT:
            self.sent.append((target, list(parts)))
        return answer

    def deliver(self, attempt: Callable[[], Wait | None], halted: Callable[[], bool]) -> bool:
        for _ in range(5):  # bounded: a fake has nobody to wait for
            if halted():
                return False
            what = attempt()
            if what is None:
                return True
            self.waits.append(what)
        return False

    def count(self, frames: Sequence[Any]) -> None:
        self.bytes_sent += sum(len(frame) for frame in frames)

    def to(self, target: bytes) -> list[list[Any]]:
        return [parts for sent_to, parts in self.sent if sent_to == target]


class NoSocket:
    """A data socket with nothing to read (the link reads credit from the test instead)."""

    def getsockopt(self, option: int) -> int:
        return 0


def message(*positions: int) -> list[Any]:
    tags = np.array([[1, position] for position in positions])
    return list(encode(Data(tags, [f"s{position}" for position in positions])))


def positions(frames: Sequence[Any]) -> list[int]:
    return [int(position) for position in read_tags(list(frames))[:, 1]]


def _core(**options: Any) -> ControlCore:
    return ControlCore(ServerConfig(source="unused:source", **options), started=0.0)


class AnyWithRoom:
    """A recovery policy that keeps nothing: any member with room, in turn, no envelope.
    The server's one policy is ReliableFree; this one isolates the dealer's own rules
    (who is tried, what a full or gone trainer means, what a message nobody took waits
    for) from credit and acknowledgements."""

    keeps = False

    def __init__(self) -> None:
        self.sent_to: list[bytes] = []

    def turn(self) -> None:
        pass

    def candidates(self, members: list[bytes] | None,
                   resent: Entry | None = None) -> list[tuple[bytes, bytes]]:
        return [(member, member) for member in members or ()]

    def envelope(self) -> list[bytes]:
        return []

    def sent(self, identity: bytes, frames: Sequence[Any], resent: Entry | None) -> None:
        self.sent_to.append(identity)

    def gone(self, identity: bytes) -> None:
        pass

    def next_redeal(self) -> Entry | None:
        return None

    def redeal_later(self, entry: Entry) -> None:
        raise AssertionError("this policy keeps nothing to deal again")

    def wait(self, capped: bool) -> Wait:
        return Wait.BRIEF if capped else Wait.ROOM


def plain_dealer(outbox: FakeOutbox, core: ControlCore) -> Dealer:
    carrier = Carrier(None, core, 8, outbox, lambda: False)  # type: ignore[arg-type]
    return Dealer(outbox, core, carrier, lambda: False,  # type: ignore[arg-type]
                  lambda name: AnyWithRoom())


def reliable_dealer(outbox: FakeOutbox, core: ControlCore) -> tuple[Dealer, ReliableLink]:
    link = ReliableLink(NoSocket(), outbox, "s")  # type: ignore[arg-type]
    carrier = Carrier(None, core, 8, outbox, lambda: False)  # type: ignore[arg-type]
    dealer = Dealer(outbox, core, carrier, lambda: False,  # type: ignore[arg-type]
                    lambda name: ReliableFree(link, name), [NO_ACK], link.credits.takes)
    return dealer, link


def test_a_free_message_goes_to_the_first_member_with_room() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer = plain_dealer(outbox, core)
    audience = dealer.free_audience("", lambda: [b"a", b"b", b"c"])
    outbox.answers = {b"a": FULL, b"b": GONE}
    sent, _ = dealer.send(message(0), audience)
    assert sent and [target for target, _ in outbox.sent] == [b"c"]
    assert outbox.to(b"c")[0] == message(0)  # this policy puts no envelope before it
    assert audience.policy.sent_to == [b"c"]  # type: ignore[attr-defined]


def test_a_free_message_nobody_can_take_waits_for_room_and_is_not_lost() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer = plain_dealer(outbox, core)
    outbox.answers = {b"a": FULL}
    sent, frames = dealer.send(message(0), dealer.free_audience("", lambda: [b"a"]))
    assert not sent and frames == message(0) and outbox.waits == [Wait.ROOM] * 5
    assert dealer.offer(message(0), None, dealer.free_audience("", lambda: [])) is Wait.ROOM


def test_a_reliable_message_goes_to_the_member_with_most_credit_with_its_seq() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer, link = reliable_dealer(outbox, core)
    link.credits.take(b"za", Credit(client_id="a", credits=2))
    link.credits.take(b"zb", Credit(client_id="b", credits=3))
    audience = dealer.free_audience("", lambda: None)
    assert dealer.send(message(0), audience)[0] and dealer.send(message(1), audience)[0]
    assert dealer.send(message(2), audience)[0]
    # b had the most credit; then each had 2 left, and a (granted first) goes first.
    assert [target for target, _ in outbox.sent] == [b"zb", b"za", b"zb"]
    assert [unpack_envelope(parts)[0] for _, parts in outbox.sent] == [1, 2, 3]
    assert link.credits.unacknowledged == 3 and link.credits.credit(b"za") == 1
    link.credits.take(b"zb", Ack(seqs=[1, 3]))
    assert link.credits.unacknowledged == 1


def test_a_lost_group_member_s_rest_goes_to_its_group_only() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer, link = reliable_dealer(outbox, core)
    credits = link.credits
    for identity, client in ((b"z1", "a1"), (b"z2", "a2"), (b"z3", "b1")):
        credits.take(identity, Credit(client_id=client, credits=4))
    group_a = dealer.free_audience("a", lambda: [b"a1", b"a2"])
    group_b = dealer.free_audience("b", lambda: [b"b1"])
    outbox.answers = {b"z2": FULL}
    assert dealer.send(message(0, 1, 2), group_a)[0]  # to a1 (a2's queue is full)
    assert dealer.send(message(0, 1, 2), group_b)[0]  # the same sample, group b's
    assert [target for target, _ in outbox.sent] == [b"z1", b"z3"]
    # a1 handed out position 0 of its message, then died (its next send fails).
    credits.record_mark(Ack(seqs=[1], client_id="a1", server_id="s", epoch=1, position=0))
    outbox.answers = {b"z1": GONE, b"z2": FULL}
    assert dealer.offer(message(3), None, group_a) is Wait.CREDIT  # a2 still full
    assert credits.stats()["lost_trainers"] == 1 and not outbox.to(b"z2")
    outbox.answers = {b"z1": GONE}
    assert dealer.send(message(3), group_a)[0]
    # a2 got a1's rest (cut after its mark) first, then the new message; b got nothing more.
    assert [positions(parts[1:]) for parts in outbox.to(b"z2")] == [[1, 2], [3]]
    assert len(outbox.to(b"z3")) == 1
    assert credits.ledger_of("a").held() == 2 and credits.ledger_of("b").held() == 1
    assert not credits.ledger_of("").held()


def test_a_lost_member_s_rest_waits_for_another_member_of_its_group() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer, link = reliable_dealer(outbox, core)
    link.credits.take(b"z1", Credit(client_id="a1", credits=4))
    link.credits.take(b"z3", Credit(client_id="b1", credits=4))
    group_a = dealer.free_audience("a", lambda: [b"a1"])
    assert dealer.send(message(0), group_a)[0]
    link.credits.lose(b"z1")
    # b1 has credit, but is not in group a: the rest stays queued for a's next member.
    assert not dealer.redeal(group_a) and link.credits.ledger_of("a").held() == 1
    link.credits.take(b"z2", Credit(client_id="a2", credits=4))
    group_a.members = lambda: [b"a2"]
    assert dealer.redeal(group_a) and [positions(p[1:]) for p in outbox.to(b"z2")] == [[0]]
    assert not outbox.to(b"z3")


def epoch_message(epoch: int, first: int) -> list[Any]:
    tags = np.array([[epoch, position] for position in range(first, first + 10)])
    return list(encode(Data(tags, [f"{epoch}.{position}" for position, in tags[:, 1:]])))


def epochs_to(outbox: FakeOutbox, target: bytes) -> list[tuple[int, int]]:
    """(epoch, first position) of each data message ``target`` was sent, in order."""
    return [(int(tags[0, 0]), int(tags[0, 1]))
            for tags in (read_tags(parts[1:]) for parts in outbox.to(target))]


def dataloader_pass_ended(sharers: int) -> tuple[FakeOutbox, ControlCore, Dealer, ReliableLink,
                                                 FreeAudience, list[float]]:
    """A reliable dealer whose free trainers say ``sharers`` share the stream (a DataLoader's
    workers), after a pass's two workers left holding epoch 2 and 3 (three messages each,
    positions 0, 10, 20): what is left to deal again. The link's clock is the list's item."""
    outbox, core, clock = FakeOutbox(), _core(), [0.0]
    link = ReliableLink(NoSocket(), outbox, "s", clock=lambda: clock[0])  # type: ignore[arg-type]
    carrier = Carrier(None, core, 8, outbox, lambda: False)  # type: ignore[arg-type]
    dealer = Dealer(outbox, core, carrier, lambda: False,  # type: ignore[arg-type]
                    lambda name: ReliableFree(link, name, sharers=core.sharers), [NO_ACK],
                    link.credits.takes)
    audience = dealer.free_audience("", lambda: None)
    for worker in ("old0", "old1"):
        core.receive(b"c-" + worker.encode(), Hello(worker, world_size=sharers), now=0.0)
        link.credits.take(worker.encode(), Credit(client_id=worker, credits=8))
    for epoch in (2, 3):
        for first in (0, 10, 20):
            assert dealer.send(epoch_message(epoch, first), audience)[0]
    for worker in (b"old0", b"old1"):  # they leave one after the other (their goodbyes)
        core.peer_gone(b"c-" + worker)
        link.lose(worker, goodbye=True)
        dealer.redeal(audience)
    outbox.sent.clear()
    return outbox, core, dealer, link, audience, clock


def join(core: ControlCore, link: ReliableLink, worker: str, sharers: int) -> None:
    core.receive(b"c-" + worker.encode(), Hello(worker, world_size=sharers), now=0.0)
    link.credits.take(worker.encode(), Credit(client_id=worker, credits=8))


def test_a_pass_s_leftovers_are_shared_by_the_next_pass_s_workers_in_epoch_order() -> None:
    # torch's non-persistent workers: the next pass's first worker to grant credit got
    # all of it, the second none of epoch 2, and the in-order DataLoader waited on it.
    outbox, core, dealer, link, audience, _ = dataloader_pass_ended(sharers=2)
    join(core, link, "new0", 2)
    assert not dealer.redeal(audience)  # one of epoch 2 is kept for the other worker
    assert epochs_to(outbox, b"new0") == [(2, 0), (2, 10)]
    join(core, link, "new1", 2)
    assert dealer.redeal(audience)
    got = {worker: epochs_to(outbox, worker) for worker in (b"new0", b"new1")}
    assert got[b"new1"][0] == (2, 20)  # each worker's first message is of epoch 2
    for messages in got.values():  # and no worker gets an epoch after a later one
        assert messages == sorted(messages) and any(epoch == 3 for epoch, _ in messages)
    assert sorted(got[b"new0"] + got[b"new1"]) == [(e, p) for e in (2, 3) for p in (0, 10, 20)]


def test_leftovers_kept_for_a_sharer_that_never_comes_go_to_the_others_after_a_while() -> None:
    outbox, core, dealer, link, audience, clock = dataloader_pass_ended(sharers=2)
    join(core, link, "new0", 2)
    assert not dealer.redeal(audience)
    clock[0] = SHARE_WAIT - 0.1
    assert not dealer.redeal(audience) and len(outbox.to(b"new0")) == 2
    clock[0] = SHARE_WAIT
    assert dealer.redeal(audience) and len(outbox.to(b"new0")) == 6
    assert epochs_to(outbox, b"new0") == sorted(epochs_to(outbox, b"new0"))


def test_a_trainer_that_shares_with_nobody_takes_the_leftovers_at_once() -> None:
    outbox, core, dealer, link, audience, _ = dataloader_pass_ended(sharers=1)
    join(core, link, "alone", 1)
    assert dealer.redeal(audience)
    assert epochs_to(outbox, b"alone") == [(e, p) for e in (2, 3) for p in (0, 10, 20)]


def test_a_rank_s_message_goes_to_its_holder_and_a_successor_gets_the_rest_first() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer = plain_dealer(outbox, core)
    now = time.monotonic()
    core.receive(b"c0", Hello("r0", rank=0, world_size=1), now=now)
    ledger = Ledger(Recovery.REPLAY, limit=8)
    ranks = RankAudience(core.rank_target, lambda: ledger, lambda: [0], dealer.rank_sender)
    assert dealer.send(message(0, 1), ranks, rank=0)[0]
    assert [target for target, _ in outbox.sent] == [b"r0"]
    ledger.record_mark(0, b"r0", (1, 0))
    core.peer_gone(b"c0")
    assert dealer.offer(message(2), None, ranks, rank=0) is Wait.ROOM  # nobody holds it
    core.receive(b"c1", Hello("r1", rank=0, world_size=1), now=now)
    assert dealer.send(message(2), ranks, rank=0)[0]
    assert [positions(parts) for parts in outbox.to(b"r1")] == [[1], [2]]
    assert core.samples_sent == 1  # the replay counts as sent (the new one, the caller)


def test_a_free_audience_s_members_are_asked_at_each_try() -> None:
    outbox, core = FakeOutbox(), _core()
    dealer = plain_dealer(outbox, core)
    members: list[bytes] = []
    audience = FreeAudience("g", lambda: list(members), AnyWithRoom())
    assert dealer.offer(message(0), None, audience) is Wait.ROOM
    members.append(b"late")
    assert dealer.offer(message(0), None, audience) is None and outbox.to(b"late")


# -- sequences: two reliable groups, members joining, handing out, killed ---------------------

@dataclass
class _Member:
    identity: bytes
    group: str
    #: Messages received and not handed out whole: [seq, positions, handed out so far].
    queue: deque[list[Any]] = field(default_factory=deque)


_GROUPS = ("a", "b")
_ACTIONS = st.lists(st.tuples(st.sampled_from(["join", "sample", "hand", "mark", "ack", "kill"]),
                              st.integers(0, 5), st.integers(1, 3)), min_size=10, max_size=60)


@settings(max_examples=100, deadline=None)
@given(_ACTIONS)
def test_each_reliable_group_hands_out_each_sample_once_across_kills(
        steps: list[tuple[str, int, int]]) -> None:
    outbox, core = FakeOutbox(), _core()
    dealer, link = reliable_dealer(outbox, core)
    credits = link.credits
    members: dict[bytes, _Member] = {}
    audiences = {name: dealer.free_audience(name, functools.partial(
        lambda name: [m.identity for m in members.values() if m.group == name], name))
        for name in _GROUPS}
    pending: dict[str, deque[list[Any]]] = {name: deque() for name in _GROUPS}
    handed: dict[str, list[int]] = {name: [] for name in _GROUPS}
    sent_positions: list[int] = []
    joined = 0

    def pump() -> None:
        for name, queue in pending.items():
            while queue and dealer.offer(queue[0], None, audiences[name]) is None:
                queue.popleft()
            dealer.redeal(audiences[name])
        for target, parts in outbox.sent:  # what each member received, in order
            seq, frames = unpack_envelope(parts)
            members[target].queue.append([seq, positions(frames), 0])
        outbox.sent.clear()

    def whole(member: _Member) -> list[int]:
        held = {item[0] for item in member.queue}
        ledger = credits.ledger_of(member.group)
        return [entry.seq for entry in ledger.entries(member.identity) if entry.seq not in held]

    for action, which, size in steps:
        names = sorted(members)
        member = members[names[which % len(names)]] if names else None
        if action == "join":
            identity = f"t{joined}".encode()
            joined += 1
            members[identity] = _Member(identity, _GROUPS[which % 2])
            credits.take(identity, Credit(client_id=identity.decode(), credits=size))
        elif action == "sample":
            frames = message(*range(len(sent_positions), len(sent_positions) + size))
            sent_positions.extend(positions(frames))
            for queue in pending.values():
                queue.append(frames)
        elif action == "hand" and member is not None:
            for _ in range(size):
                if not member.queue:
                    break
                head = member.queue[0]
                handed[member.group].append(head[1][head[2]])
                head[2] += 1
                if head[2] == len(head[1]):
                    member.queue.popleft()
        elif action == "ack" and member is not None:
            credits.take(member.identity, Ack(seqs=whole(member)))
        elif action in ("mark", "kill") and member is not None:
            current = member.queue[0] if member.queue else None
            if current is not None and current[2]:  # how far it handed out its message
                credits.record_mark(Ack(seqs=[current[0]], client_id=member.identity.decode(),
                                        server_id="s", epoch=1,
                                        position=current[1][current[2] - 1]))
            if action == "kill":
                credits.record_mark(Ack(seqs=whole(member), client_id=member.identity.decode(),
                                        server_id="s", epoch=1, position=-1))
                del members[member.identity]
                outbox.answers[member.identity] = GONE  # its next send finds it gone
        pump()
        for name in _GROUPS:
            got = handed[name]
            assert len(got) == len(set(got)), f"group {name}: a sample handed out twice"
            ledger = credits.ledger_of(name)
            kept = {p for entry in ledger.entries() for p in positions(entry.frames)}
            redeal = {p for entry in ledger.redeal for p in positions(entry.frames)}
            waiting = {p for frames in pending[name] for p in positions(frames)}
            assert not redeal & set(got), f"group {name}: a handed-out sample is dealt again"
            assert set(got) | kept | redeal | waiting == set(sent_positions), f"group {name}: lost"
            for live in members.values():  # what a live member holds, its group's ledger keeps
                if live.group == name:
                    assert {p for item in live.queue for p in item[1][item[2]:]} <= kept
