"""The books of the shared-memory pool's allocator: which granules are taken, and by which run.

This module owns the allocation state of a pool's data area, kept in anonymous
shared mappings made before the server forks its sampling workers, so that the
server and every worker see the same books: a busy flag per granule, the length
of each run at its head granule, and the flag that says whether the server sends
through the pool now. The data area is cut into regions, one for the server and
one per worker (:meth:`RunBooks.split`), and each process allocates only in its
own: a region has a single writer, so the hot path takes no lock and sends no
message. The other processes only read (the statistics sum the busy flags; the
server adopts the runs of a worker that died, :meth:`RunBooks.adopt`). Which of a
process's runs are free again is read from the segment's slot table by the pool;
this module never maps the segment, never reads the slot table and never decides
when a run is free: it records what the pool decided.

A run's memory may still be referred to by an object of the allocating process
(a rank's message the server keeps for a successor, a sample it has not sent yet):
such a run is *pinned* (:attr:`RunBooks.pinned`), and is not taken back, whatever
the slot table says, until that object is gone. A worker's run that the server
reads in place (it decoded the worker's message to deal it to ranks, or to cut
batches) is *kept* (:attr:`RunBooks.kept`: a count per run, in the shared
mapping, that the server alone writes and the worker reads), and the worker
does not take it back while the count is above zero.
"""

from __future__ import annotations

import itertools
import mmap

import numpy as np

__all__ = ["RunBooks"]


class RunBooks:
    """Busy granules, run lengths and regions of one pool, shared across a fork.

    Examples
    --------
    >>> books = RunBooks(8)
    >>> books.split(1)  # the server's region, then one worker's
    [(0, 4), (4, 8)]
    >>> books.take(books.find(3), 3), books.find(1), books.find(2)
    (0, 3, -1)
    >>> books.enter(1)  # what the worker does after the fork
    >>> books.take(books.find(2), 2), books.in_use()
    (4, 5)
    """

    def __init__(self, granules: int) -> None:
        self.granules = granules
        # Anonymous and MAP_SHARED: a forked worker writes the same pages.
        self._memory = mmap.mmap(-1, 8 + granules * 9)
        whole = np.frombuffer(self._memory, np.uint8)
        self._wanted = whole[:8].view(np.int64)
        self.lengths: np.ndarray = whole[8 : 8 + granules * 4].view(np.int32)
        #: Per head granule: the server's live views of that run (a worker's, read in place
        #: by the server; written by the server process alone).
        self.kept: np.ndarray = whole[8 + granules * 4 : 8 + granules * 8].view(np.int32)
        self.busy: np.ndarray = whole[8 + granules * 8 :].view(bool)
        self.regions: list[tuple[int, int]] = [(0, granules)]
        self.lo, self.hi = 0, granules
        #: This process's runs not known to be free (head granule -> granules).
        self.runs: dict[int, int] = {}
        #: Heads of this process's runs whose memory an object of this process still holds.
        self.pinned: set[int] = set()

    @property
    def wanted(self) -> bool:
        """Whether the server sends through the pool now (a trainer on this host maps it):
        the copy that makes a drawn array the server's own is made in the pool only then."""
        return bool(self._wanted[0])

    @wanted.setter
    def wanted(self, value: bool) -> None:
        self._wanted[0] = int(value)

    def split(self, workers: int) -> list[tuple[int, int]]:
        """Cut the granules into the server's region and one per worker (before the fork).

        The server's region is as large as a worker's: with workers it only copies
        what a worker could not place (its region was full) and what it must decode.
        """
        if self.runs or workers < 1 or self.granules < workers + 1:
            raise ValueError(f"expected an unused pool of at least {workers + 1} granules for "
                             f"{workers} worker(s), got {self.granules} granules, "
                             f"{len(self.runs)} run(s) in use")
        parts = workers + 1
        bounds = [self.granules * part // parts for part in range(parts + 1)]
        self.regions = list(itertools.pairwise(bounds))
        self.lo, self.hi = self.regions[0]
        return self.regions

    def enter(self, worker: int) -> None:
        """This process is worker ``worker`` (from 1): it allocates in that region only."""
        self.lo, self.hi = self.regions[worker]
        self.runs, self.pinned = {}, set()

    def find(self, count: int) -> int:
        """The head of the lowest ``count`` free granules of this region (first fit), or -1."""
        free = np.flatnonzero(~self.busy[self.lo : self.hi])
        if len(free) < count:
            return -1
        if count == 1:
            return self.lo + int(free[0])
        ends = np.flatnonzero(free[count - 1:] - free[: len(free) - count + 1] == count - 1)
        return self.lo + int(free[ends[0]]) if len(ends) else -1

    def take(self, head: int, count: int) -> int:
        """Record the run of ``count`` granules at ``head``; returns ``head``."""
        # The length first: a process killed between the two writes leaves a length
        # without busy granules (harmless to adopt), never busy granules without a length.
        self.lengths[head] = count
        self.busy[head : head + count] = True
        self.runs[head] = count
        return head

    def free(self, head: int) -> None:
        count = self.runs.pop(head)
        self.busy[head : head + count] = False
        self.lengths[head] = 0

    def adopt(self, region: int) -> list[int]:
        """Make the runs of ``region`` (a dead worker's) this process's; their heads."""
        lo, hi = self.regions[region]
        heads: list[int] = (lo + np.flatnonzero(self.lengths[lo:hi])).tolist()
        for head in heads:
            self.runs[head] = int(self.lengths[head])
        return heads

    def is_pinned(self, head: int) -> bool:
        """Whether the memory of the run at ``head`` is still held: by an object of this
        process (:attr:`pinned`), or by the server's views of it (:attr:`kept`)."""
        return head in self.pinned or bool(self.kept[head])

    def in_use(self) -> int:
        """Granules taken in every region (every process's runs)."""
        return int(np.count_nonzero(self.busy))
