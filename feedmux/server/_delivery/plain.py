"""Plain delivery (no acknowledgements): free trainers and ranks, by socket or shared memory.

:class:`PlainRoute` owns where one plain data message goes: to the next free
trainer with room in its queue (dynamic dealing), or to the trainer holding its
rank (a successor gets its predecessor's rest first, through
:class:`~feedmux.server._delivery.ranksend.RankSender`); to a trainer that maps
the server's shared-memory pool as references to the pool, to the others as
it is (the :class:`~feedmux.server._delivery.carrier.Carrier` decides). It tries
and waits through the :class:`~feedmux.server._delivery.outbox.Outbox`
and must never send on a socket itself, decide who holds a rank (the control
core does), or keep a message once it left (the rank's ledger does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedmux._plumbing.shm import Placement
from feedmux.protocol import read_tags
from feedmux.server._control.core import ControlCore
from feedmux.server._delivery.carrier import Carrier
from feedmux.server._delivery.outbox import Outbox, Wait
from feedmux.server._delivery.ranksend import RankSender

__all__ = ["PlainRoute"]


class PlainRoute:
    """Free and ranked messages of a plain server, each to a trainer that has room,
    carried by socket or shared memory (``carrier``); ranked messages also on a
    reliable server (each preceded by ``envelope``: acknowledged by the rank's
    hand-out marks, not by sequence number; each within its holder's credit,
    ``room``)."""

    def __init__(self, outbox: Outbox, core: ControlCore, carrier: Carrier,
                 halted: Callable[[], bool], envelope: Sequence[bytes] = (),
                 room: Callable[[bytes, int], bool] | None = None) -> None:
        self.outbox = outbox
        self.core = core
        self.carrier = carrier
        self.halted = halted
        self.envelope = envelope
        #: Whether a rank's holder takes another message (a reliable trainer's credit).
        self.room = room
        #: Ranked delivery: each rank's messages to its holder, a successor's hand-over first.
        self.ranked = self._sender()

    def send(self, frames: Sequence[Any], rank: int = -1) -> tuple[bool, Sequence[Any]]:
        """Send one message (to ``rank``'s holder, or -1: any free trainer), waiting while
        nobody can take it; whether it went (not if the server stopped, restarted or opened
        consumer groups meanwhile), and its frames from now on (whole bytes if not)."""
        frames, placed = self.carrier.place(frames, kept=False)  # a rank's kept: pinned runs
        tries = 0

        def attempt() -> Wait | None:
            nonlocal tries
            tries += 1
            if rank >= 0:
                sent, capped = self._to_rank(rank, frames, placed)
            else:
                sent, capped = self._to_free(frames, placed)
            if sent:
                return None
            # A ROUTER is writable when any trainer's queue has room, which may not be this
            # rank's: after the first try, a brief look at control alone; so too when a
            # trainer on this host had room but too many pool references in transit.
            return Wait.ROOM if (rank < 0 and not capped) or tries == 1 else Wait.BRIEF

        sent = False
        try:
            sent = self.outbox.deliver(attempt, self.halted)
        finally:  # unless delivered (went by socket, or nowhere): its runs back
            frames = self.carrier.settle(placed, frames, sent)
        return sent, frames

    def _to_rank(self, rank: int, frames: Sequence[Any],
                 placed: Placement | None) -> tuple[bool, bool]:
        """Send a rank's message to its holder. Returns (sent, held back for the cap)."""
        target = self.core.rank_target(rank)
        if target is None:
            return False, False
        wire = self.carrier.wire(target, frames, placed)
        if wire is None:
            return False, True
        if not self.ranked.send(rank, target, frames, None if wire is frames else wire):
            return False, False
        self.carrier.delivered(target, wire, placed)
        return True, False

    def _to_free(self, frames: Sequence[Any], placed: Placement | None) -> tuple[bool, bool]:
        """Offer a message to each free trainer in turn. Returns (sent, a trainer was
        skipped for the cap)."""
        capped = False
        wires: dict[bytes, Sequence[Any] | None] = {}

        def wire(target: bytes) -> Sequence[Any] | None:
            nonlocal capped
            parts = wires[target] = self.carrier.wire(target, frames, placed)
            capped = capped or parts is None
            return parts

        target = self.outbox.first(self.core.free_targets(), wire)  # full or gone: the next
        if target is None:
            return False, capped
        self.carrier.delivered(target, wires[target] or (), placed)
        self.core.questions.sent_to(target)  # its own end of stream comes from this
        return True, capped
    def replay_taken_over(self) -> None:
        """Hand every rank taken over since the last look its predecessor's rest."""
        core = self.core
        if self.ranked.retention is not core.retention:
            # The job restarted from a checkpoint: its previous ranks are owed nothing.
            self.ranked = self._sender()
        if core.ranks.ranked:
            self.ranked.replay_taken_over(list(core.ranks.holders), core.rank_target)

    def _sender(self) -> RankSender:
        return RankSender(self.outbox, self.core.retention, self._replayed, self.envelope,
                          self.room)

    def _replayed(self, frames: Sequence[Any]) -> None:
        self.outbox.count(frames)
        tags = read_tags(frames)
        self.core.data_sent(len(tags), int(tags[0, 0]))
