"""What each rank was sent and has not yet handed out: the hand-over of a restarted rank.

This module owns, per rank of a ranked run, the data messages sent to its
holder beyond the point the holder acknowledged (a ranked loader acknowledges
the last ``(epoch, position)`` it handed out, batched every few milliseconds),
and the re-send a successor needs: when a rank's data goes to a new client id
(a restarted trainer took the rank over), everything its predecessor was sent
and did not hand out goes first, starting right after the last acknowledged
sample — the first message cut there and re-encoded. It is pure (frames in,
frames out; no socket, no clock) and must never decide who holds a rank: the
control core does, and the shell sends what this returns.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedmux.protocol import Data, decode, encode, read_tags

__all__ = ["RankRetention", "rest_after"]

log = logging.getLogger("feedmux.server")


def rest_after(frames: list[Any], mark: tuple[int, int]) -> tuple[np.ndarray, list[Any]] | None:
    """The tags and frames of the samples of a data message after ``(epoch, position)``.

    The message as it is when none was handed out, re-encoded when some were,
    None when all were (positions grow within a message).

    >>> from feedmux.protocol import Data, encode
    >>> frames = list(encode(Data(np.array([[1, 0], [1, 2]]), ["a", "b"])))
    >>> tags, rest = rest_after(frames, (1, 0))
    >>> tags.tolist(), rest_after(frames, (1, 2))
    ([[1, 2]], None)
    """
    tags = read_tags(frames)
    rows = [i for i, row in enumerate(tags.tolist()) if tuple(row) > mark]
    if not rows:
        return None
    if len(rows) == len(tags):
        return tags, frames
    message = decode(frames)
    assert isinstance(message, Data)
    samples = list(message.samples)
    kept = tags[rows].copy()
    return kept, list(encode(Data(kept, [samples[i] for i in rows], message.server_id)))


@dataclass
class _Sent:
    target: bytes  # the data-socket identity it went to
    tags: np.ndarray
    frames: list[Any]


class RankRetention:
    """Per rank: the messages sent and not yet acknowledged as handed out.

    ``limit`` bounds the messages kept per rank (a trainer that never
    acknowledges must not grow the server without end): beyond it the oldest
    is forgotten, with one warning per rank.

    Examples
    --------
    >>> from feedmux.protocol import Data, encode
    >>> retention = RankRetention(limit=8)
    >>> frames = list(encode(Data(np.array([[1, 0], [1, 2], [1, 4]]), ["a", "b", "c"])))
    >>> retention.sent(0, b"old", frames)
    >>> retention.handed(0, b"old", epoch=1, position=2)
    >>> retention.pending(0, b"new")
    True
    >>> [read_tags(frames).tolist() for _, frames in retention.replay(0, b"new")]
    [[[1, 4]]]
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._sent: dict[int, deque[_Sent]] = {}
        self._handed: dict[int, tuple[int, int]] = {}  # rank -> last (epoch, position) handed out
        self._warned: set[int] = set()
        self._owner: dict[int, bytes] = {}  # rank -> the identity its kept messages went to
        self.replayed_messages = 0

    def sent(self, rank: int, target: bytes, frames: list[Any]) -> None:
        """A data message went to ``target`` as ``rank``'s share."""
        queue = self._sent.setdefault(rank, deque())
        self._owner.setdefault(rank, target)
        queue.append(_Sent(target, read_tags(frames), frames))
        if len(queue) > self.limit:
            queue.popleft()
            if rank not in self._warned:
                self._warned.add(rank)
                log.warning("rank %d acknowledges nothing: keeping only its last %d messages for "
                            "a restart", rank, self.limit)

    def handed(self, rank: int, target: bytes, epoch: int, position: int) -> None:
        """``target`` handed out ``rank``'s share up to and including ``(epoch, position)``.

        An acknowledgement from an earlier holder (it crossed the hand-over)
        only counts for what is still recorded as sent to it; one from a client
        this rank's data never went to counts for nothing (anyone can reach the
        control port, and a mark moved ahead would cut what a successor gets).
        """
        queue = self._sent.get(rank)
        if self._owner.get(rank) != target and not any(e.target == target for e in queue or ()):
            return
        mark = (epoch, position)
        if mark > self._handed.get(rank, (0, -1)):
            self._handed[rank] = mark
        while queue and queue[0].target == target and tuple(queue[0].tags[-1].tolist()) <= mark:
            queue.popleft()

    def pending(self, rank: int, target: bytes) -> bool:
        """Whether ``rank`` has messages its new holder ``target`` must get before new data."""
        return bool(self._sent.get(rank)) and self._owner.get(rank) != target

    def replay(self, rank: int, target: bytes) -> list[tuple[Any, list[Any]]]:
        """What the new holder ``target`` of ``rank`` must get first: ``(handle, frames)``.

        Messages sent to an earlier holder, in order, the first one cut right
        after the last sample handed out (re-encoded). Tell :meth:`moved` each
        handle that was sent, then :meth:`settled` once all were.
        """
        queue = self._sent.get(rank)
        if not queue:
            return []
        mark = self._handed.get(rank, (0, -1))
        out: list[tuple[Any, list[Any]]] = []
        kept: deque[_Sent] = deque()
        for entry in queue:
            if entry.target != target:
                rest = rest_after(entry.frames, mark)
                if rest is None:
                    continue  # handed out whole by the predecessor
                entry.tags, entry.frames = rest
                out.append((entry, entry.frames))
            kept.append(entry)
        self._sent[rank] = kept
        return out

    def moved(self, handle: Any, target: bytes) -> None:
        """The message behind ``handle`` (from :meth:`replay`) went to ``target``."""
        handle.target = target
        self.replayed_messages += 1

    def settled(self, rank: int, target: bytes, count: int) -> None:
        """Every message of the replay went to ``target``: new data may follow."""
        self._owner[rank] = target
        if count:
            log.info("rank %d taken over: re-sent %d message(s) from after %s", rank, count,
                     self._handed.get(rank, (0, -1)))

    def held(self) -> int:
        """Messages kept in all (for the statistics; read from the metrics thread too, hence
        a copy of the queues first)."""
        return sum(len(queue) for queue in list(self._sent.values()))
