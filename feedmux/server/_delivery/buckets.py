"""Coordinated steps for variable-length samples: the bucketing window and its dealing rule.

A data-parallel step takes as long as its slowest rank, and a rank is slow when
its batch holds the longest samples. With ``bucket_by=`` the ranked stage does
not deal positions ``p -> p % n``: it keeps a bounded window of the samples
drawn and deals each *step* (``n`` batches of ``B``, one per rank) from
samples of similar length, so every rank of a step pads to about the same
length and none waits for another. This module owns that rule, over lengths
and opaque rows: :class:`BucketWindow`. It is pure (no sockets, no clock, no
encoding; a sample is whatever the caller holds) and must never read a
sample's fields (the caller gives each row's length) nor decide who holds a
rank.

The rule, applied as if the rows came one at a time (so the steps depend on
the order of the rows only, never on how they were chunked: a resumed run
that samples the epoch again gets the same steps):

1. With ``edges`` (ascending lengths; bucket ``i`` holds lengths in
   ``[edges[i-1], edges[i])``), a bucket that reaches ``n * B`` rows is dealt
   at once: its ``n * B`` oldest rows form the step.
2. When the window holds ``window`` rows, half of it is dealt: the
   runs of ``n * B`` neighbours in the window's length order that waste the
   least padding (``1 - mean / max`` of their lengths), picked one after the
   other without overlap. Without edges this is the only rule: the buckets are
   the runs of neighbours in the window's length order, so their edges follow
   the data seen. A row that waited while ``MAX_WAIT_WINDOWS * window`` later
   rows came goes out in the next such pass (in the least wasteful run that
   holds it), so a rare long sample is not kept to the epoch's end. (Several
   steps a pass: the window's cost is paid once for them.)
3. At the end of the epoch the rows held are dealt in length order: whole
   steps first, then the last, partial one (fewer than ``n * B`` rows; for one
   rank, a free trainer's buckets, each bucket's rows apart, its own last one),
   round by round (row ``i`` to rank ``i % n``); its last partial round is
   completed with repeats of that step's first rows (``uneven="pad"``) or
   left out (``"drop"``), counted in :attr:`padded` / :attr:`dropped`, so
   every rank gets the same number of samples (``ceil(E / n)`` or
   ``E // n`` of an epoch of ``E``, as without buckets).

Within a step the rows are sorted by length and rank ``perm[g]`` gets the
``g``-th run of ``B`` of them, ``perm`` a permutation of the ranks drawn per
step from ``(seed, epoch)`` (no rank is always the one with the longest of a
step). The positions of a step's rows are those of the dealing without
buckets: the ``k``-th step of an epoch holds positions ``k*n*B ..
(k+1)*n*B - 1``, rank ``r``'s ``j``-th row position ``k*n*B + j*n + r``, so
resume positions, acknowledgements and epoch lengths mean what they mean for
any ranked batches (docs/resume.md): a position counts what was dealt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ConfigurationError
from feedmux.server.config import check_edges

__all__ = ["DEFAULT_WINDOW_STEPS", "BucketWindow", "Step", "window_size"]

#: The default window, in steps of ``n * B`` samples (``--bucket-window 0``): what
#: ``benchmarks/bench_buckets.py`` shows meets 1.5x lower step time and at most 10% padding
#: on lognormal lengths (docs/ddp.md).
DEFAULT_WINDOW_STEPS = 16
#: A row held while ``MAX_WAIT_WINDOWS * window`` later rows arrived goes out in the next
#: step the full window deals (the run of its neighbours that wastes the least).
MAX_WAIT_WINDOWS = 16


def window_size(window: int, world_size: int, batch_size: int) -> int:
    """The window in samples: ``window`` (0: :data:`DEFAULT_WINDOW_STEPS` steps), at least
    one step of ``world_size * batch_size``.

    Examples
    --------
    >>> window_size(0, 4, 32), window_size(100, 4, 32), window_size(1000, 4, 32)
    (2048, 128, 1000)
    """
    step = world_size * batch_size
    if not window:
        return DEFAULT_WINDOW_STEPS * step
    return max(window, step)


class Step(NamedTuple):
    """One step dealt: ``ranks[r]`` is rank ``r``'s rows (its batch: a list, or an array of
    a window of numbered rows), the ``j``-th at position ``start + j * n + r`` of ``epoch``,
    and ``lengths[r]`` their lengths."""

    epoch: int
    start: int
    ranks: list[Any]
    lengths: list[np.ndarray]

    def positions(self, rank: int) -> np.ndarray:
        """The positions of ``rank``'s rows."""
        n = len(self.ranks)
        return self.start + rank + n * np.arange(len(self.ranks[rank]), dtype=np.int64)


class BucketWindow:
    """The window of rows held for ``world_size`` ranks, dealt a step of ``world_size *
    batch_size`` rows at a time by the rules of this module.

    Feed it the rows of an epoch in order with their lengths (:meth:`add`),
    then call :meth:`finish_epoch`. It never holds more than ``window`` rows
    (:attr:`held`). Rows are opaque: it keeps references, in slots. With ``row_dtype`` a
    numpy dtype (numbered rows: ints the caller resolves, say) it keeps them in an array of
    it, takes them as an array and deals each batch as one, with no Python object per row.

    Examples
    --------
    >>> window = BucketWindow(2, 2, window=4)
    >>> [step.ranks for step in window.add(1, [5, 1, 9, 2], list("abcd"))]
    [[['b', 'd'], ['a', 'c']]]
    >>> [(step.start, step.ranks) for step in window.finish_epoch(1)]
    []
    >>> steps = window.add(2, [3, 4, 8], list("xyz"))
    >>> [(step.start, step.ranks) for step in window.finish_epoch(2)], window.padded
    ([(0, [['x', 'z'], ['y', 'x']])], 1)
    """

    def __init__(self, world_size: int, batch_size: int, window: int = 0,
                 edges: Sequence[int] = (), uneven: str = "pad", seed: int = 0,
                 row_dtype: Any = object) -> None:
        if uneven not in ("pad", "drop"):
            raise ConfigurationError(f"expected uneven 'pad' or 'drop', got {uneven!r}")
        self.world_size = world_size
        self.batch_size = batch_size
        self.step = world_size * batch_size
        self.window = window_size(window, world_size, batch_size)
        #: Steps dealt at once when the window is full (half of what it holds).
        self.steps_per_pass = max(1, self.window // (2 * self.step))
        self.edges = np.asarray(check_edges(edges), dtype=np.int64)
        self.uneven = uneven
        self.seed = seed
        #: Samples added to an epoch's last round as repeats (pad), or left out (drop).
        self.padded = 0
        self.dropped = 0
        #: Steps dealt because the window was full (rule 2), and because a bucket was (rule 1).
        self.window_steps = 0
        self.bucket_steps = 0
        #: Steps of rule 2 made around a row that waited :data:`MAX_WAIT_WINDOWS` windows.
        self.late_steps = 0
        size = self.window
        self._numbered = np.dtype(row_dtype) != np.dtype(object)
        self._rows = np.zeros(size, dtype=row_dtype) if self._numbered else np.full(
            size, None, dtype=object)
        self._length = np.zeros(size, dtype=np.int64)
        self._order = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)  # arrival; max: free
        self._bucket = np.zeros(size, dtype=np.int64)
        self._counts = np.zeros(len(self.edges) + 1, dtype=np.int64)
        # The slots held in length order (then arrival), and their lengths: kept sorted as
        # rows come and go, so that no step sorts the window.
        self._sorted = np.zeros(0, dtype=np.int64)
        self._sorted_lengths = np.zeros(0, dtype=np.int64)
        self._arrived = 0
        self._held = 0
        self._epoch = 0
        self._next = 0  # the position of the epoch's next step
        self._rng = np.random.default_rng([seed, 0])
        # The ranks' turns of the next steps, drawn a block at a time; the next one's row.
        self._turns, self._turn = np.zeros((0, world_size), dtype=np.int64), 0

    @property
    def held(self) -> int:
        """Rows held now (at most :attr:`window`)."""
        return self._held

    def rows(self) -> Any:
        """The rows held now (in no particular order): a list, an array of numbered rows."""
        held = self._rows[self._sorted]
        return held if self._numbered else held.tolist()

    def add(self, epoch: int, lengths: Sequence[int] | np.ndarray,
            rows: Sequence[Any] | np.ndarray) -> list[Step]:
        """The steps that ``rows`` (the next of ``epoch``, of ``lengths``) complete."""
        if epoch != self._epoch:
            if self._held:
                raise ValueError(f"expected finish_epoch({self._epoch}) before rows of {epoch}")
            self._epoch, self._next = epoch, 0
            self._rng = np.random.default_rng([self.seed, epoch])
            self._turns, self._turn = np.zeros((0, self.world_size), dtype=np.int64), 0
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) != len(rows):
            raise ValueError(f"expected a length per row, got {len(lengths)} for {len(rows)}")
        steps: list[Step] = []
        index, count = 0, len(rows)
        while index < count:
            take = min(count - index, self.window - self._held)
            buckets = np.zeros(take, dtype=np.int64)
            if len(self.edges):
                buckets = np.searchsorted(self.edges, lengths[index:index + take], side="right")
            full = self._first_full(buckets) if len(self.edges) else -1
            if full >= 0:
                take = full + 1
            self._insert(lengths[index:index + take], buckets[:take], rows[index:index + take])
            index += take
            if full >= 0:
                self.bucket_steps += 1
                steps += self._deal(self._removed(self._of_bucket(int(buckets[full]))))
            elif self._held == self.window:
                runs = self._least_waste()
                self.window_steps += len(runs)
                steps += self._deal(self._removed(np.concatenate(runs)))
        return steps

    def finish_epoch(self, epoch: int, by_bucket: bool = False) -> list[Step]:
        """``epoch`` has no more rows: every row held, in length order, whole steps then
        the last, partial one (its last round padded or dropped). ``by_bucket`` (with
        ``edges``): each bucket's rows apart, whole steps then its own last one, so that
        no step mixes two buckets (one rank's batches: no step need match another's).

        Examples
        --------
        >>> window = BucketWindow(1, 3, window=8, edges=[4])
        >>> window.add(1, [1, 5, 2, 6], list("abcd"))
        []
        >>> [step.ranks for step in window.finish_epoch(1, by_bucket=True)]
        [[['a', 'c']], [['b', 'd']]]
        """
        if epoch != self._epoch or not self._held:
            return []
        slots = self._removed(slice(None))
        groups = [slots]
        if by_bucket and len(self.edges):  # (each group stays in length order)
            buckets = self._bucket[slots]
            groups = [slots[buckets == bucket] for bucket in np.unique(buckets).tolist()]
        steps = []
        for group in groups:
            whole = len(group) - len(group) % self.step
            steps += self._deal(group[:whole]) if whole else []
            if len(group) > whole:
                steps += self._last(group[whole:])
        return [step for step in steps if any(map(len, step.ranks))]

    # -- the rules ------------------------------------------------------------------------
    def _first_full(self, buckets: np.ndarray) -> int:
        """The index of the first of ``buckets`` (the next rows' buckets) at which its bucket
        holds a whole step, or -1."""
        order = np.argsort(buckets, kind="stable")
        ordered = buckets[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        sizes = np.diff(np.r_[starts, len(ordered)])
        within = np.arange(len(ordered)) - np.repeat(starts, sizes)  # rank inside its bucket
        reached = self._counts[ordered] + within + 1 >= self.step
        if not reached.any():
            return -1
        return int(order[reached].min())

    def _of_bucket(self, bucket: int) -> np.ndarray:
        """Where the ``n * B`` oldest rows of ``bucket`` are in the length order."""
        slots = np.flatnonzero((self._bucket == bucket) & (self._order != _FREE))
        oldest = slots[np.argsort(self._order[slots], kind="stable")[:self.step]]
        return np.flatnonzero(np.isin(self._sorted, oldest))

    def _least_waste(self) -> list[np.ndarray]:
        """Where the runs of ``n * B`` neighbours in length order that waste the least
        padding (``1 - mean / max`` of their lengths) are: :attr:`steps_per_pass` runs that
        do not overlap, the least wasteful first (the first one, among the runs that hold
        the oldest row if it waited :data:`MAX_WAIT_WINDOWS` windows)."""
        lengths, m = self._sorted_lengths, self.step
        sums = np.concatenate(([0], np.cumsum(lengths)))
        waste = 1.0 - (sums[m:] - sums[:-m]) / (m * np.maximum(lengths[m - 1:], 1))
        runs = []
        oldest = int(np.argmin(self._order))
        if self._arrived - int(self._order[oldest]) > MAX_WAIT_WINDOWS * self.window:
            self.late_steps += 1
            where = int(np.flatnonzero(self._sorted == oldest)[0])
            first = max(0, where - m + 1)
            runs.append(first + int(np.argmin(waste[first:where + 1])))
            waste[max(0, runs[0] - m + 1):runs[0] + m] = np.inf
        while len(runs) < self.steps_per_pass:
            start = int(np.argmin(waste))
            if waste[start] == np.inf:
                break
            runs.append(start)
            waste[max(0, start - m + 1):start + m] = np.inf
        return [np.arange(start, start + m) for start in runs]

    def _removed(self, where: slice | np.ndarray) -> np.ndarray:
        """The slots at ``where`` in the length order, taken out of it."""
        slots = self._sorted[where]
        if type(where) is slice:  # a run: what is before it and after it
            start, stop, _ = where.indices(len(self._sorted))
            self._sorted = np.concatenate((self._sorted[:start], self._sorted[stop:]))
            self._sorted_lengths = np.concatenate((self._sorted_lengths[:start],
                                                   self._sorted_lengths[stop:]))
        else:
            kept = np.ones(len(self._sorted), dtype=bool)
            kept[where] = False
            self._sorted, self._sorted_lengths = self._sorted[kept], self._sorted_lengths[kept]
        return slots

    def _insert(self, lengths: np.ndarray, buckets: np.ndarray,
                rows: Sequence[Any] | np.ndarray) -> None:
        free = np.flatnonzero(self._order == _FREE)[:len(lengths)]
        self._length[free] = lengths
        self._bucket[free] = buckets
        self._order[free] = np.arange(self._arrived, self._arrived + len(lengths))
        if len(self.edges):
            self._counts += np.bincount(buckets, minlength=len(self._counts))
        # The new rows are newer than every row held: after them among equal lengths (a
        # stable sort of the two runs, a merge).
        joined = np.concatenate((self._sorted_lengths, lengths))
        order = np.argsort(joined, kind="stable")
        self._sorted = np.concatenate((self._sorted, free))[order]
        self._sorted_lengths = joined[order]
        self._arrived += len(lengths)
        self._held += len(lengths)
        if self._numbered:
            self._rows[free] = rows
        else:  # (fromiter: a row that is itself a sequence stays one object)
            self._rows[free] = np.fromiter(rows, dtype=object, count=len(free))

    def _release(self, slots: np.ndarray) -> tuple[Any, np.ndarray]:
        """The rows of ``slots`` (in that order; a list, an array of numbered rows) and their
        lengths, no longer held."""
        rows: Any = self._rows[slots]
        if not self._numbered:
            rows = rows.tolist()
            self._rows[slots] = None
        if len(self.edges):
            self._counts -= np.bincount(self._bucket[slots], minlength=len(self._counts))
        self._order[slots] = _FREE
        self._held -= len(slots)
        return rows, self._length[slots]

    def _deal(self, slots: np.ndarray) -> list[Step]:
        """Whole steps of ``slots`` (each run of ``n * B`` of them sorted by length): a
        step's run ``g`` of ``B`` to rank ``perm[g]``."""
        rows, lengths = self._release(slots)
        b, n = self.batch_size, self.world_size
        steps = []
        for start in range(0, len(slots), self.step):
            if self._turn == len(self._turns):
                self._turns = self._rng.permuted(np.tile(np.arange(n), (_TURNS_DRAWN, 1)), axis=1)
                self._turn = 0
            turns, self._turn = self._turns[self._turn], self._turn + 1
            ranks: list[Any] = [None] * n
            runs: list[np.ndarray] = [lengths[:0]] * n
            for at, rank in zip(range(start, start + self.step, b), turns.tolist(), strict=True):
                ranks[rank], runs[rank] = rows[at:at + b], lengths[at:at + b]
            steps.append(self._stepped(ranks, runs))
        return steps

    def _last(self, slots: np.ndarray) -> list[Step]:
        """The epoch's last, partial step: round by round, its last round evened."""
        rows, lengths = self._release(slots)
        n = self.world_size
        short = -len(rows) % n
        if short and self.uneven == "pad":
            self.padded += short
            repeats = np.arange(short) % len(rows)
            if self._numbered:
                rows = np.concatenate((rows, rows[repeats]))
            else:
                rows += [rows[i] for i in repeats.tolist()]
            lengths = np.concatenate((lengths, lengths[repeats]))
        elif short:
            self.dropped += n - short
            rows, lengths = rows[:len(rows) - (n - short)], lengths[:len(rows) - (n - short)]
        return [self._stepped([rows[rank::n] for rank in range(n)],
                              [lengths[rank::n] for rank in range(n)])]

    def _stepped(self, ranks: list[Any], lengths: list[np.ndarray]) -> Step:
        step = Step(self._epoch, self._next, ranks, lengths)
        self._next += sum(map(len, ranks))
        return step


_FREE = np.iinfo(np.int64).max
#: The ranks' turns drawn at once (a block of steps' permutations).
_TURNS_DRAWN = 64
