"""The dealing stage: one data message to one audience, free trainers or ranks.

:class:`Dealer` owns the one send path of data messages. An *audience* is who
may get a message: the free trainers of the server or of one consumer group
(:class:`FreeAudience`: whoever has room takes it), or the ranks of the server
or of one ranked group (:class:`RankAudience`: the holder of the message's
rank, a successor getting its predecessor's rest first through
:class:`~feedmux.server._delivery.ranksend.RankSender`). A server without
groups is one free audience and one rank audience; each consumer group is an
audience fed from the groups' buffer. How a message travels to each trainer
(socket or shared-memory references) is the
:class:`~feedmux.server._delivery.carrier.Carrier`'s choice; what becomes of a
free message once sent is the audience's *recovery policy*,
:class:`~feedmux.server._delivery.reliable.ReliableFree` (credit, sequence
numbers, a ledger of unacknowledged messages and the re-deal of a lost
trainer's rest to the audience's other members). The dealer tries and waits
through the :class:`~feedmux.server._delivery.outbox.Outbox`; it must never
send on a socket itself, decide who holds a rank (the control core does), or
keep a message once it left (the ledgers do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from feedmux._plumbing.shm import Placement
from feedmux.protocol import read_tags
from feedmux.server._control.core import ControlCore
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.ledger import Entry, Ledger
from feedmux.server._delivery.outbox import GONE, SENT, Outbox, Wait
from feedmux.server._delivery.ranksend import RankSender

__all__ = ["Dealer", "FreeAudience", "FreePolicy", "RankAudience"]


class FreePolicy(Protocol):
    """What becomes of a free audience's messages: who may take the next one, in which
    order, with which envelope, and what is kept of it once sent."""

    #: Whether a sent message is kept to be dealt again (the carrier keeps whole bytes).
    keeps: bool

    def turn(self) -> None:
        """Before each attempt: take in what the trainers said (credit, acknowledgements)."""

    def candidates(self, members: list[bytes] | None,
                   resent: Entry | None = None) -> list[tuple[bytes, bytes]]:
        """``(data identity, client id)`` of the trainers that may take a message now,
        in the order to try them, among ``members`` (client ids; None: every trainer);
        ``resent``: the message is a lost trainer's, dealt again."""

    def envelope(self) -> list[bytes]:
        """What goes before the message on the wire."""

    def sent(self, identity: bytes, frames: Sequence[Any], resent: Entry | None) -> None:
        """``frames`` went to ``identity`` (``resent``: a lost trainer's, dealt again)."""

    def gone(self, identity: bytes) -> None:
        """A send found ``identity`` not connected."""

    def next_redeal(self) -> Entry | None:
        """A lost trainer's message to deal before any new one, taken (None: none)."""

    def redeal_later(self, entry: Entry) -> None:
        """``entry`` (from :meth:`next_redeal`) found nobody: first again."""

    def wait(self, capped: bool) -> Wait:
        """What a message nobody took waits for (``capped``: a trainer had room but too
        many pool references on their way)."""


@dataclass
class FreeAudience:
    """The free trainers of the server (``name`` "") or of one consumer group.

    ``members()`` gives their client ids, the next in turn first (None: every
    trainer the policy knows).
    """

    name: str
    members: Callable[[], list[bytes] | None]
    policy: FreePolicy


class RankAudience:
    """The ranks of the server or of one ranked group: ``target_of(rank)`` is the data
    identity of a rank's holder; ``ledger()`` the ranks' ledger now (a job restarted
    from a checkpoint starts a new one: its previous ranks are owed nothing), and
    ``holders()`` the ranks held."""

    def __init__(self, target_of: Callable[[int], bytes | None], ledger: Callable[[], Ledger],
                 holders: Callable[[], list[int]],
                 sender: Callable[[Ledger], RankSender]) -> None:
        self.target_of = target_of
        self.ledger = ledger
        self.holders = holders
        self._make_sender = sender
        self.sender = sender(ledger())

    def replay_taken_over(self) -> None:
        """Hand every rank taken over since the last look its predecessor's rest."""
        if self.sender.retention is not self.ledger():
            self.sender = self._make_sender(self.ledger())
        self.sender.replay_taken_over(self.holders(), self.target_of)


class Dealer:
    """Deals data messages to audiences, by socket or pool references (``carrier``).

    ``halted()`` says when a waiting message stops waiting; ``policy(name)`` is the
    recovery policy of the free audience ``name`` (the server's: "", or a group's).
    On a reliable server (``rank_envelope``, ``rank_room``) a rank's message goes
    after an envelope that wants no sequence-number acknowledgement, within its
    holder's credit.
    """

    def __init__(self, outbox: Outbox, core: ControlCore, carrier: Carrier,
                 halted: Callable[[], bool], policy: Callable[[str], FreePolicy],
                 rank_envelope: Sequence[bytes] = (),
                 rank_room: Callable[[bytes, int], bool] | None = None) -> None:
        self.outbox = outbox
        self.core = core
        self.carrier = carrier
        self.halted = halted
        self.policy = policy
        self.rank_envelope = rank_envelope
        self.rank_room = rank_room

    def free_audience(self, name: str, members: Callable[[], list[bytes] | None],
                      ) -> FreeAudience:
        """The free audience ``name`` (its members' client ids from ``members()``) under
        this server's recovery policy."""
        return FreeAudience(name, members, self.policy(name))

    def rank_sender(self, ledger: Ledger) -> RankSender:
        """A sender of ranked messages kept in ``ledger`` (a replay counts as sent)."""
        return RankSender(self.outbox, ledger, self._replayed, self.rank_envelope,
                          self.rank_room)

    def send(self, frames: Sequence[Any], audience: FreeAudience | RankAudience,
             rank: int = -1) -> tuple[bool, Sequence[Any]]:
        """Deal one message (to ``rank``'s holder of a rank audience), waiting while nobody
        can take it; whether it went (not once halted), and its frames from now on (whole
        bytes if not). The bytes that left are counted."""
        keeps = isinstance(audience, FreeAudience) and audience.policy.keeps
        frames, placed = self.carrier.place(frames, keeps=keeps)  # a rank's: pinned runs
        tries = 0

        def attempt() -> Wait | None:
            nonlocal tries
            tries += 1
            return self.offer(frames, placed, audience, rank, first=tries == 1)

        sent = False
        try:
            sent = self.outbox.deliver(attempt, self.halted)
        finally:  # unless delivered (went by socket, or nowhere): its runs back
            frames = self.carrier.settle(placed, frames, sent)
        return sent, frames

    def offer(self, frames: Sequence[Any], placed: Placement | None,
              audience: FreeAudience | RankAudience, rank: int = -1,
              first: bool = True) -> Wait | None:
        """One try at dealing a message (placed in the pool as ``placed``, or None); None
        if it went, else what to wait for before the next try."""
        if isinstance(audience, RankAudience):
            sent, capped = self._to_rank(audience, rank, frames, placed)
            # A ROUTER is writable when any trainer's queue has room, which may not be
            # this rank's: after the first try, a brief look at control alone.
            return None if sent else Wait.ROOM if first and not capped else Wait.BRIEF
        policy = audience.policy
        policy.turn()
        if not self.redeal(audience):
            return policy.wait(False)
        skipped = self._to_free(audience, frames, placed, None)
        return None if skipped is None else policy.wait(skipped)

    def redeal(self, audience: FreeAudience) -> bool:
        """Deal the audience's lost trainers' rest first, as far as it goes; True once
        none is left."""
        policy = audience.policy
        while (entry := policy.next_redeal()) is not None:
            if self._to_free(audience, entry.frames, None, entry) is not None:
                policy.redeal_later(entry)
                return False
        return True

    def _to_free(self, audience: FreeAudience, frames: Sequence[Any], placed: Placement | None,
                 resent: Entry | None) -> bool | None:
        """Offer a message to each of the audience's trainers in turn. Returns None if one
        took it, else whether a trainer was skipped for the pool's cap."""
        policy, capped = audience.policy, False
        for identity, trainer in policy.candidates(audience.members(), resent):
            # The pool knows a trainer by its client id, the socket by its identity.
            wire = self.carrier.wire(trainer, frames, placed)
            if wire is None:
                capped = True
                continue
            sent = self.outbox.send(identity, [*policy.envelope(), *wire])
            if sent is SENT:
                policy.sent(identity, frames, resent)
                self.carrier.delivered(trainer, wire, placed)
                return None
            if sent is GONE:
                policy.gone(identity)
        return capped

    def _to_rank(self, audience: RankAudience, rank: int, frames: Sequence[Any],
                 placed: Placement | None) -> tuple[bool, bool]:
        """Send a rank's message to its holder. Returns (sent, held back for the cap)."""
        target = audience.target_of(rank)
        if target is None:
            return False, False
        wire = self.carrier.wire(target, frames, placed)
        if wire is None:
            return False, True
        if not audience.sender.send(rank, target, frames, None if wire is frames else wire):
            return False, False
        self.carrier.delivered(target, wire, placed)
        return True, False

    def _replayed(self, frames: Sequence[Any]) -> None:
        self.outbox.count(frames)
        tags = read_tags(frames)
        self.core.data_sent(len(tags), int(tags[0, 0]))
