"""Where a ranked trainer stands with each of its servers: what it saves and announces.

A rank of a data-parallel job hands out, from each server, the samples dealt
to it: with ``n`` ranks, rank ``r``'s sample at position ``p`` belongs to the
round of positions ``p - r .. p - r + n - 1`` (rounds start where the epoch,
or a resumed part of it, starts), so after handing it out the job needs the
round starting at ``p - r + n``. :class:`RankPositions` keeps that per server
link: it is what ``RemoteLoader.state_dict()`` saves and what the trainer's
hello announces — restored from a checkpoint (every rank the same, the job
resumes there) or live after a server restart (each rank where it is). It is
pure: the loader tells it what was handed out; it never touches a socket.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedmux.errors import StreamValueError
from feedmux.protocol import RESUME_CHECKPOINT, RESUME_LIVE

__all__ = ["CHECKPOINT", "HANDED_RANGES", "LIVE", "HandedRanges", "RankPositions", "position_runs"]

CHECKPOINT, LIVE = RESUME_CHECKPOINT, RESUME_LIVE

#: ``() -> (link, tags, handed-out count)`` of the loader's current message, or None.
Current = Callable[[], "tuple[int, Any, int] | None"]


class RankPositions:
    """Per server link: the next round a ranked trainer's job needs, ``(epoch, position)``.

    Examples
    --------
    >>> import numpy as np
    >>> positions = RankPositions(1, rank=1, world_size=2, current=lambda: None)
    >>> positions.announce(0)
    ()
    >>> positions.handed(0, np.array([3, 7]))   # rank 1 handed out position 7 of epoch 3
    >>> positions.announce(0), positions.state()
    ((3, 8, 2, 0), [[3, 8, 2]])
    >>> restored = RankPositions(1, rank=0, world_size=3, current=lambda: None)
    >>> restored.restore([[3, 8, 2]])
    >>> restored.announce(0)
    (3, 8, 2, 1)
    """

    def __init__(self, links: int, *, rank: int, world_size: int, current: Current) -> None:
        self.rank = rank
        self.world_size = world_size
        self._current = current
        #: link -> (epoch, next position, world size) from samples handed out here
        self._live: list[tuple[int, int, int] | None] = [None] * links
        #: link -> (epoch, next position, world size) loaded from a checkpoint
        self._restored: list[tuple[int, int, int] | None] = [None] * links

    def handed(self, link: int, row: Any) -> None:
        """The trainer handed out the sample tagged ``row`` (epoch, position) of ``link``."""
        self._live[link] = (int(row[0]), int(row[1]) - self.rank + self.world_size,
                            self.world_size)

    def next_message(self, fresh: bool) -> bool:
        """The loader is about to make a new message current: note how far it got in the
        one before; returns ``fresh`` (False: a message a restarted server's old process
        sent, which the loader drops — the new one resumes where the rank stands)."""
        current = self._current()
        if current is not None and current[2] > 0:
            self.handed(current[0], current[1][current[2] - 1])
        return fresh

    def _where(self, link: int) -> tuple[tuple[int, int, int] | None, int]:
        current = self._current()
        if current is not None and current[0] == link and current[2] > 0:
            self.handed(link, current[1][current[2] - 1])
        live = self._live[link]
        if live is not None:
            return live, LIVE
        return self._restored[link], CHECKPOINT

    def announce(self, link: int) -> tuple[int, ...]:
        """What the hello to ``link``'s server says: ``(epoch, position, world_size,
        CHECKPOINT or LIVE)``, or ``()`` before anything (a fresh start)."""
        where, kind = self._where(link)
        return () if where is None else (*where, kind)

    def state(self) -> list[list[int] | None]:
        """Per link ``[epoch, position, world_size]`` or None: plain data for a checkpoint."""
        return [None if where is None else list(where)
                for where in (self._where(link)[0] for link in range(len(self._live)))]

    def restore(self, saved: Sequence[Sequence[int] | None]) -> None:
        """Take the positions :meth:`state` saved (any rank's: they are the job's)."""
        if not isinstance(saved, (list, tuple)) or len(saved) != len(self._restored):
            raise StreamValueError(
                f"expected a saved position for each of the {len(self._restored)} server(s), "
                f"got {saved!r}"
            )
        restored: list[tuple[int, int, int] | None] = []
        for where in saved:
            if where is None:
                restored.append(None)
                continue
            if not (isinstance(where, (list, tuple)) and len(where) == 3
                    and all(isinstance(value, int) for value in where)
                    and where[0] >= 1 and where[1] >= 0 and where[2] >= 1):
                raise StreamValueError(
                    f"expected a saved position [epoch >= 1, position >= 0, world_size >= 1], "
                    f"got {where!r}"
                )
            restored.append((where[0], where[1], where[2]))
        self._restored = restored
        self._live = [None] * len(self._live)


#: Handed-out position ranges a free reliable trainer keeps per server (its latest messages).
HANDED_RANGES = 32


class HandedRanges:
    """Per server link: the positions a free reliable trainer handed out lately, as ranges.

    What it says in its hello to a restarted server (``Hello.handed``): the
    ranges of its last :data:`HANDED_RANGES` messages (the current one up to
    what was handed out), so that the new process deals none of them again.
    Older positions are behind every trainer's frontier (a server deals in
    position order). One numpy pass per message, nothing per sample.

    Examples
    --------
    >>> import numpy as np
    >>> handed = HandedRanges(1, current=lambda: None)
    >>> handed.handed(0, np.array([[2, 8], [2, 9], [2, 11]]))
    >>> handed.announce(0)
    (2, 8, 10, 2, 11, 12)
    """

    def __init__(self, links: int, *, current: Current) -> None:
        self._current = current
        self._ranges: list[collections.deque[tuple[int, int, int]]] = [
            collections.deque(maxlen=HANDED_RANGES) for _ in range(links)]

    def handed(self, link: int, tags: Any) -> None:
        """The trainer handed out the samples tagged ``tags`` (rows of epoch, position)."""
        self._ranges[link].extend(position_runs(tags))

    def next_message(self, fresh: bool) -> bool:
        """The loader is about to make a new message current: note the one before;
        returns ``fresh`` (as :meth:`RankPositions.next_message`)."""
        current = self._current()
        if current is not None and current[2] > 0:
            self.handed(current[0], current[1][: current[2]])
        return fresh

    def announce(self, link: int) -> tuple[int, ...]:
        """``(epoch, start, end, ...)`` for the hello to ``link``'s server (the current
        message's handed-out part included)."""
        ranges = list(self._ranges[link])
        current = self._current()
        if current is not None and current[0] == link:
            ranges += position_runs(current[1][: current[2]])
        return tuple(value for triple in ranges for value in triple)


def position_runs(tags: Any) -> list[tuple[int, int, int]]:
    """``(epoch, start, end)`` of each run of consecutive positions in ``tags`` (one epoch)."""
    if not len(tags):
        return []
    epoch, positions = int(tags[0, 0]), tags[:, 1]
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    if not len(breaks):  # the usual message: one run (np.split costs ~40 µs a message)
        return [(epoch, int(positions[0]), int(positions[-1]) + 1)]
    starts = positions[np.concatenate(([0], breaks))].tolist()
    lasts = positions[np.concatenate((breaks - 1, [len(positions) - 1]))].tolist()
    return [(epoch, start, last + 1) for start, last in zip(starts, lasts, strict=True)]
