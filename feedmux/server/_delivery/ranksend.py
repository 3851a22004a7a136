"""Sends one rank's data messages to the trainer holding it, its predecessor's rest first.

:class:`RankSender` owns the socket side of a ranked hand-over: a message for a
rank goes to its holder with a non-blocking addressed send on the data ROUTER,
and is recorded in the rank's :class:`~feedmux.server._delivery.retention.RankRetention`;
when the rank has a new holder (a restarted trainer took it over), what the
predecessor was sent and did not hand out goes first. The ranked delivery of a
whole server and of each ranked consumer group both use it. It must never
decide who holds a rank (the control core does) nor what a rank gets (the
dealing rule does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zmq

from feedmux.server._delivery.retention import RankRetention

__all__ = ["RankSender"]


class RankSender:
    """Addressed sends of ranked data messages, with the hand-over of a restarted rank.

    ``on_replayed(frames)`` is called for every message re-sent to a new
    holder, for the counters (the caller counts the new messages it sends).
    """

    def __init__(self, data: Any, retention: RankRetention,
                 on_replayed: Callable[[Sequence[Any]], None]) -> None:
        self.data = data
        self.retention = retention
        self.on_replayed = on_replayed

    def send(self, rank: int, target: bytes, frames: Sequence[Any],
             wire: Sequence[Any] | None = None) -> bool:
        """Send ``frames`` to ``target``, the holder of ``rank``; False if it cannot take it now.

        ``wire``, when given, is what goes on the socket instead (the message placed
        in the shared-memory pool); ``frames`` are what is kept for a successor.
        A rank taken over by a restarted trainer gets what its predecessor did
        not hand out first (nothing new until that is through).
        """
        if self.retention.pending(rank, target) and not self.replay(rank, target):
            return False
        try:
            self.data.send_multipart([target, *(frames if wire is None else wire)],
                                     flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            # Again: its queue is full (HWM); EHOSTUNREACH: its data connection is not up
            # yet, or gone (the control heartbeats decide that).
            return False
        self.retention.sent(rank, target, list(frames))
        return True

    def replay(self, rank: int, target: bytes) -> bool:
        """Send ``rank``'s new holder what its predecessor did not hand out; True when done."""
        retention = self.retention
        sent = 0
        for handle, frames in retention.replay(rank, target):
            try:
                self.data.send_multipart([target, *frames], flags=zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                return False  # not connected yet, or full: again at the next turn
            retention.moved(handle, target)
            self.on_replayed(frames)
            sent += 1
        retention.settled(rank, target, sent)
        return True

    def replay_taken_over(self, ranks: Iterable[int],
                          target_of: Callable[[int], bytes | None]) -> None:
        """Hand over every rank of ``ranks`` (the held ones: not every rank of a world
        size a peer chose) taken over since the last look (also with no new data)."""
        for rank in ranks:
            target = target_of(rank)
            if target is not None and self.retention.pending(rank, target):
                self.replay(rank, target)
