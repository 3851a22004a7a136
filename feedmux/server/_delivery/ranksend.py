"""Sends one rank's data messages to the trainer holding it, its predecessor's rest first.

:class:`RankSender` owns the socket side of a ranked hand-over: a message for a
rank goes to its holder through the :class:`~feedmux.server._delivery.outbox.Outbox`,
and is recorded in the rank's lane of a
:class:`~feedmux.server._delivery.ledger.Ledger` (recovery: replay to the rank's
successor); when the rank has a new holder (a restarted trainer took it over),
what the predecessor was sent and did not hand out goes first. While the rank's
lane is full (its holder acknowledges nothing), nothing more goes to it: what
it was sent and never handed out is never forgotten. The ranked delivery of a
whole server and of each ranked consumer group both use it. It must never
decide who holds a rank (the control core does) nor what a rank gets (the
dealing rule does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from feedmux.server._delivery.ledger import Ledger
from feedmux.server._delivery.outbox import SENT, Outbox

__all__ = ["RankSender"]

log = logging.getLogger("feedmux.server")


class RankSender:
    """Addressed sends of ranked data messages, with the hand-over of a restarted rank.

    ``on_replayed(frames)`` is called for every message re-sent to a new
    holder, for the counters (the caller counts the new messages it sends).
    ``envelope`` goes before every message on the wire (the data socket's envelope
    of a message the rank's hand-out marks acknowledge), and ``room(target,
    held)``, when given, says whether ``target`` takes one more message while it
    holds ``held`` (the credit its holder granted).
    """

    def __init__(self, outbox: Outbox, retention: Ledger,
                 on_replayed: Callable[[Sequence[Any]], None],
                 envelope: Sequence[bytes] = (),
                 room: Callable[[bytes, int], bool] | None = None) -> None:
        self.outbox = outbox
        self.retention = retention
        self.on_replayed = on_replayed
        self.envelope = list(envelope)
        self.room = room
        #: Per rank being handed over: the mark its predecessor's rest was cut at (a
        #: hand-over that takes several turns sees the new holder's own marks meanwhile).
        self._cut_at: dict[int, tuple[int, int] | None] = {}

    def send(self, rank: int, target: bytes, frames: Sequence[Any],
             wire: Sequence[Any] | None = None) -> bool:
        """Send ``frames`` to ``target``, the holder of ``rank``; False if it cannot take it now.

        ``wire``, when given, is what goes on the socket instead (the message placed
        in the shared-memory pool); ``frames`` are what is kept for a successor.
        A rank taken over by a restarted trainer gets what its predecessor did
        not hand out first (nothing new until that is through).
        """
        ledger = self.retention
        if ledger.owed(rank, target) and not self.replay(rank, target):
            return False
        if not ledger.room(rank) or not self._takes(target, ledger.count(rank)):
            return False  # its holder has not said it handed out what it holds: wait
        if self.outbox.send(target, [*self.envelope, *(frames if wire is None else wire)]
                            ) is not SENT:
            return False  # full, or not connected (the control heartbeats decide that)
        ledger.record(rank, target, list(frames))
        return True

    def replay(self, rank: int, target: bytes) -> bool:
        """Send ``rank``'s new holder what its predecessor did not hand out; True when done."""
        ledger = self.retention
        cut_at = self._cut_at.setdefault(rank, ledger.mark(rank))
        rest = ledger.take_over(rank, target)
        for index, entry in enumerate(rest):
            if not self._takes(target, index) or self.outbox.send(
                    target, [*self.envelope, *entry.frames]) is not SENT:
                ledger.put_back(rank, rest[index:])  # not connected yet, or full: next turn
                return False
            ledger.resent(rank, entry, target)
            self.on_replayed(entry.frames)
        del self._cut_at[rank]
        if rest:
            log.info("rank %d taken over: re-sent %d message(s) from after %s", rank,
                     len(rest), cut_at or (0, -1))
        return True

    def _takes(self, target: bytes, held: int) -> bool:
        return self.room is None or self.room(target, held)

    def replay_taken_over(self, ranks: Iterable[int],
                          target_of: Callable[[int], bytes | None]) -> None:
        """Hand over every rank of ``ranks`` (the held ones: not every rank of a world
        size a peer chose) taken over since the last look (also with no new data)."""
        for rank in ranks:
            target = target_of(rank)
            if target is not None and self.retention.owed(rank, target):
                self.replay(rank, target)
