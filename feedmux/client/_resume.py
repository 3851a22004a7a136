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

import bisect
import collections
from collections.abc import Callable, Sequence
from typing import Any

from feedmux.errors import StreamValueError
from feedmux.protocol import RESUME_CHECKPOINT, RESUME_LIVE, position_runs

__all__ = ["CHECKPOINT", "HANDED_RANGES", "LIVE", "HandedRanges", "Outstanding", "RankPositions"]

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


#: Handed-out position ranges a free trainer keeps per server (its latest messages), what
#: its hello to a restarted server says it handed out since the server's last summary: a
#: trainer of length-bucketed batches hands out scattered positions (a batch of 7 is up
#: to 7 ranges, ~300 batches a second), so seconds of them, not the last few messages.
HANDED_RANGES = 1024


class HandedRanges:
    """Per server link: the positions a free trainer handed out lately, as ranges.

    What it says in its hello to a restarted server (``Hello.handed``): the
    ranges of its last :data:`HANDED_RANGES` messages (the current one up to
    what was handed out), so that the new process deals none of them again;
    and (``Hello.handed_below``) the last summary the old process sent of what
    every trainer had handed out, less what this trainer handed out since
    (:class:`Outstanding`): so the new process also deals again what was in
    flight, or held by a trainer that left, below this trainer's frontier.
    One numpy pass per message, nothing per sample. What it keeps of a link is
    one server process's (:meth:`serving`): once a restarted server's first
    message comes, it has heard the hello that carried the old process's
    records, and they are dropped, so that a later hello (to this server, or to
    the next one after another restart) never reports the old run's positions
    as if they were of the run it speaks to.

    Examples
    --------
    >>> import numpy as np
    >>> handed = HandedRanges(1, current=lambda: None)
    >>> handed.summarized(0, (2, 16, 2, 0, 4, 2, 8, 12))  # before 2:16, 0..3 and 8..11 not
    >>> handed.handed(0, np.array([[2, 8], [2, 9], [2, 11]]))
    >>> handed.announce(0), handed.below(0)
    ((2, 8, 10, 2, 11, 12), (2, 16, 2, 0, 4, 2, 10, 11))
    """

    def __init__(self, links: int, *, current: Current) -> None:
        self._current = current
        self._ranges: list[collections.deque[tuple[int, int, int]]] = [
            collections.deque(maxlen=HANDED_RANGES) for _ in range(links)]
        #: Per link: the server's last summary of the hand-outs, less this trainer's since.
        self._below: list[Outstanding | None] = [None] * links
        #: Per link: the id of the server process the records are of ("": none yet).
        self._server: list[str] = [""] * links

    def serving(self, link: int, server_id: str) -> None:
        """The loader makes a message of server ``server_id`` current (after
        :meth:`next_message` noted the one before): a new process on ``link`` drops the
        records of the old one.

        >>> import numpy as np
        >>> handed = HandedRanges(1, current=lambda: None)
        >>> handed.serving(0, "old"); handed.handed(0, np.array([[97, 0], [97, 1]]))
        >>> handed.serving(0, "old"); handed.announce(0)
        (97, 0, 2)
        >>> handed.serving(0, "new"); handed.announce(0), handed.below(0)
        ((), ())
        """
        if self._server[link] != server_id:
            if self._server[link]:
                self._ranges[link].clear()
                self._below[link] = None
            self._server[link] = server_id

    def handed(self, link: int, tags: Any) -> None:
        """The trainer handed out the samples tagged ``tags`` (rows of epoch, position)."""
        runs = position_runs(tags)
        self._ranges[link].extend(runs)
        below = self._below[link]
        if below is not None:
            below.remove(runs)

    def summarized(self, link: int, values: Sequence[int]) -> None:
        """``link``'s server summed up its trainers' hand-outs (``Heartbeat.handed_below``)."""
        if len(values) >= 2 and len(values) % 3 == 2:
            below = Outstanding((int(values[0]), int(values[1])), [
                (int(values[i]), int(values[i + 1]), int(values[i + 2]))
                for i in range(2, len(values), 3)])
            # The server lists what it had no acknowledgement of when it summed up: this
            # trainer may have handed some of it out before the summary came (the
            # acknowledgements lag the hand-outs by a few ms); what it remembers of its
            # own hand-outs is out of the summary at once.
            below.remove(list(self._ranges[link]))
            self._below[link] = below

    def below(self, link: int) -> tuple[int, ...]:
        """``Hello.handed_below`` for a restarted server: the last summary from ``link``'s
        server less what this trainer handed out since (the current message's part too)."""
        below = self._below[link]
        if below is None:
            return ()
        current = self._current()
        if current is not None and current[0] == link:
            below.remove(position_runs(current[1][: current[2]]))
        return below.values()

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


class Outstanding:
    """A server's summary of the hand-outs: every sample before ``newest`` handed out but
    the ``runs`` ``(epoch, start, end)``; :meth:`remove` takes out positions handed out
    since (per message: a bisection, not a scan).

    Examples
    --------
    >>> below = Outstanding((3, 40), [(2, 90, 100), (3, 8, 16)])
    >>> below.remove([(3, 10, 12), (2, 90, 100)])
    >>> below.values()
    (3, 40, 3, 8, 10, 3, 12, 16)
    """

    def __init__(self, newest: tuple[int, int], runs: Sequence[tuple[int, int, int]]) -> None:
        self.newest = newest
        self.runs = sorted(runs)
        #: (epoch, end) of each run: sorted too, since the runs are disjoint.
        self._ends = [(epoch, end) for epoch, _, end in self.runs]

    def remove(self, handed: Sequence[tuple[int, int, int]]) -> None:
        for epoch, start, end in handed:
            index = bisect.bisect_right(self._ends, (epoch, start))
            while index < len(self.runs):
                run_epoch, run_start, run_end = self.runs[index]
                if run_epoch != epoch or run_start >= end:
                    break
                pieces = [(epoch, a, b) for a, b in ((run_start, start), (end, run_end)) if a < b]
                self.runs[index:index + 1] = pieces
                self._ends[index:index + 1] = [(piece[0], piece[2]) for piece in pieces]
                index += len(pieces)

    def values(self) -> tuple[int, ...]:
        return (*self.newest, *(value for run in self.runs for value in run))
