"""The data message a loader hands out from, and how far it got in it.

:class:`HandOut` owns the current message of a :class:`~feedmux.client.remote.RemoteLoader`
(its samples, tags and server), the index of the next sample to hand out, the
last sample handed out of the message before, and what the acknowledging thread
reads. The loader's ``__next__`` reads
its fields directly (a sample costs an attribute or two, nothing more). It must
never receive, decode or send: the loader does, and replaces the message here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["HandOut", "SampleMeta"]


class SampleMeta(NamedTuple):
    """Where a sample came from: the server's epoch (1-based), its position in that
    epoch (0-based) and the id of the server process that sent it."""

    epoch: int
    position: int
    server_id: str


class HandOut:
    """The current data message and the next index in it (see the module docstring).

    Examples
    --------
    >>> import numpy as np
    >>> out = HandOut()
    >>> out.upcoming_epoch() is None, out.last_meta is None
    (True, True)
    >>> out.replace(["a", "b"], np.array([[3, 7], [3, 8]]), "s1", 2)
    >>> out.index = 1
    >>> out.last_meta, out.upcoming_epoch()
    (SampleMeta(epoch=3, position=7, server_id='s1'), 3)
    """

    __slots__ = ("__weakref__", "count", "current", "index", "last", "left", "marked",
                 "samples", "server_id", "tags")

    def __init__(self) -> None:
        self.samples: Sequence[Any] = ()
        self.tags: Any = None
        self.server_id = ""
        #: The next sample to hand out, and how many the message holds.
        self.index = self.count = 0
        #: The last sample handed out of an earlier message (or restored from a state).
        self.last: SampleMeta | None = None
        #: (link number, server id, tags, sequence number) of the current message, for the
        #: acknowledging thread (None before the first).
        self.current: tuple[int, str, Any, int] | None = None
        #: Ranked: a one-word view of the loader's mark file, where each hand-out stores the
        #: new ``index`` (feedmux.client._markfile); None: no mark file.
        self.marked: Any = None
        #: Per link number: (server id, epoch, position, sequence number) of the last
        #: sample handed out of the last message the loader left on that link. The
        #: acknowledging thread marks it there: a loader over several servers moves to
        #: another server's message between two of its looks, and a server whose messages
        #: only marks release must still hear how far it got.
        self.left: dict[int, tuple[str, int, int, int]] = {}

    @property
    def last_meta(self) -> SampleMeta | None:
        """Epoch, position and server of the sample most recently handed out."""
        if self.index == 0 or self.tags is None:
            return self.last
        row = self.tags[self.index - 1]
        return SampleMeta(int(row[0]), int(row[1]), self.server_id)

    def upcoming_epoch(self) -> int | None:
        """The epoch of the next sample, if it is here (None: the message is used up)."""
        if self.index >= self.count:
            return None
        return int(self.tags[self.index, 0])

    def between_epochs(self, finished: bool) -> bool:
        """Whether nothing of the epoch of the last sample handed out is left here: nothing
        handed out yet, the next sample known to be of a later epoch (as when
        ``iter_epoch()`` ended), or the end of the stream (``finished``)."""
        last, upcoming = self.last_meta, self.upcoming_epoch()
        return last is None or upcoming not in (None, last.epoch) or (
            upcoming is None and finished)

    def progress(self) -> tuple[int, Any, int] | None:
        """(link, tags, used) of the current message (used: its samples handed out), or None."""
        current = self.current
        return None if current is None else (current[0], current[2], self.index)

    def replace(self, samples: Sequence[Any], tags: Any, server_id: str, count: int,
                current: tuple[int, str, Any, int] | None = None) -> None:
        """Make a new message current, remembering the last sample of the old one."""
        if self.index:  # what was handed out last stays known (last_meta) across the switch
            row = self.tags[self.index - 1]
            self.last = last = SampleMeta(int(row[0]), int(row[1]), self.server_id)
            if self.current is not None and self.current[2] is self.tags:  # (once a message)
                link, left_id, _, seq = self.current
                self.left[link] = (left_id, last.epoch, last.position, seq)
        # The index first, then the message: the acknowledging thread reads them the other
        # way round (a torn read under-reports).
        self.index = self.count = 0
        self.samples, self.tags, self.server_id = samples, tags, server_id
        if current is not None:
            self.current = current
        self.count = count

    def restore_last(self, last: SampleMeta) -> None:
        """The last sample handed out, from a saved state."""
        self.last = last
        if self.index == 0:
            self.tags = None

    def drop_rest(self, link: int, stale: set[str] | frozenset[str]) -> None:
        """Server ``link`` restarted and resumes where this trainer stands: the rest of the
        old process's message (if it is the current one) will come again, so it is dropped."""
        if self.current is not None and self.current[0] == link and self.current[1] in stale:
            self.count = self.index
