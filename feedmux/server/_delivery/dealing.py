"""The ranked dealing rule: which rank of a data-parallel job gets which sample of an epoch.

This module owns the rule and nothing else. Position ``p`` of an epoch goes to
rank ``p % n`` (the order of torch's ``DistributedSampler``, ``indices[r::n]``),
and every rank gets the same number of samples per epoch: with ``"pad"`` the
last, partial round is completed with repeats of the epoch's first samples
(padded positions ``E .. n*ceil(E/n) - 1`` carry the samples of positions
``0, 1, ...``), so every rank gets ``ceil(E / n)``; with ``"drop"`` the partial
round is not delivered and every rank gets ``E // n``. It deals rows, not
items: each rank's share is taken from the dealt chunks as row slices
(:func:`~feedmux.protocol.take_samples`: a list slice, or the stacked arrays of
a decoded batch sliced), so a server passing on its workers' messages never
builds a sample. It is pure: sequences in, sequences out, no sockets, no clock,
no encoding — the ranked stage (:mod:`.ranking`) encodes what it returns and its
caller sends it. It must never decide anything about trainers (who holds a rank
is the control core's business).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ConfigurationError
from feedmux.protocol import take_samples

__all__ = ["UNEVEN_MODES", "RankDealer", "RankShare", "rank_steps"]

#: How a rank's share is evened when the epoch size is not a multiple of the world size.
UNEVEN_MODES = ("pad", "drop")


def rank_steps(epoch_size: int, world_size: int, uneven: str) -> int:
    """Samples every rank gets per epoch of ``epoch_size`` samples.

    Examples
    --------
    >>> rank_steps(10, 3, "pad"), rank_steps(10, 3, "drop"), rank_steps(9, 3, "pad")
    (4, 3, 3)
    """
    if uneven == "drop":
        return epoch_size // world_size
    return -(-epoch_size // world_size)


class RankShare(NamedTuple):
    """Samples for one rank: ``tags`` (int64, rows of (epoch, position)) and ``items``
    (a list, or a :class:`~feedmux.protocol.SampleBatch` when the dealt chunks were
    decoded batches)."""

    rank: int
    tags: np.ndarray
    items: Sequence[Any]


#: Rows ``start .. stop`` of a dealt chunk, not dealt yet.
_Rows = tuple[Sequence[Any], int, int]


class RankDealer:
    """Deals the chunks of each epoch to ``world_size`` ranks, a whole round at a time.

    Feed it the items of an epoch in position order (:meth:`deal`, any chunk
    sizes), then call :meth:`finish_epoch`. It hands out complete rounds only
    (``n`` consecutive positions, one per rank) and keeps the rest — fewer than
    ``n`` rows — for the next chunk; with ``"pad"`` it also keeps the epoch's
    first ``n - 1`` rows, to repeat them. It keeps rows of the chunks, not
    items: a rank's share of a chunk is the row slice ``start::n``, taken at C
    level (a list slice, or a decoded batch's stacked arrays sliced), with no
    per-item Python work. ``ahead`` (rank -> (epoch, position)) names live ranks
    further on than where the dealing resumes: each gets nothing of its share
    before where it stands.

    Examples
    --------
    >>> dealer = RankDealer(2, "pad")
    >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.deal(1, ["a", "b", "c"])]
    [(0, [0], ['a']), (1, [1], ['b'])]
    >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.finish_epoch(1)]
    [(0, [2], ['c']), (1, [3], ['a'])]
    """

    def __init__(self, world_size: int, uneven: str = "pad",
                 ahead: Mapping[int, tuple[int, int]] | None = None) -> None:
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ConfigurationError(f"expected world_size an int >= 1, got {world_size!r}")
        if uneven not in UNEVEN_MODES:
            raise ConfigurationError(f"expected uneven 'pad' or 'drop', got {uneven!r}")
        self.world_size = world_size
        self.uneven = uneven
        self._epoch = 0
        self._next = 0  # the position of the first row of _carry
        self._carry: list[_Rows] = []
        self._carried = 0  # rows in _carry
        self._first: list[_Rows] = []  # the epoch's first rows, one each
        #: rank -> (epoch, position) it stands at, for live ranks further on than where the
        #: dealing resumed: what comes before in their share they already had.
        self.ahead: dict[int, tuple[int, int]] = dict(ahead or {})

    def resume(self, epoch: int, position: int, head: Sequence[Any] = ()) -> None:
        """Deal ``epoch`` from ``position`` on: its items start there (a resumed run).

        The rounds are counted from ``position``: position ``p >= position`` goes
        to rank ``(p - position) % n``, so a job resumed with another world size
        shares the rest of the epoch evenly (the same rule as ``p % n`` when
        ``position`` is a multiple of ``n``, as it is when the world size did not
        change). ``head`` is the epoch's first items, which pad repeats.

        Examples
        --------
        >>> dealer = RankDealer(3, "pad")
        >>> dealer.resume(2, 4, head=["a", "b"])
        >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.deal(2, ["e", "f"])]
        []
        >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.finish_epoch(2)]
        [(0, [4], ['e']), (1, [5], ['f']), (2, [6], ['a'])]
        """
        self._epoch, self._next, self._carry, self._carried = epoch, position, [], 0
        repeatable = min(len(head), self.world_size - 1) if self.uneven == "pad" else 0
        self._first = [(head, row, row + 1) for row in range(repeatable)]

    def deal(self, epoch: int, *chunks: Sequence[Any]) -> list[RankShare]:
        """The complete rounds that ``chunks`` (the next items of ``epoch``: one
        sequence, or several in a row) finish; a rank's rows of several chunks
        come as one share."""
        if epoch != self._epoch:
            if self._carry:
                raise ValueError(
                    f"expected finish_epoch({self._epoch}) before items of epoch {epoch}"
                )
            self._epoch, self._next, self._first = epoch, 0, []
        n = self.world_size
        block = self._carry + [(chunk, 0, len(chunk)) for chunk in chunks]
        if self.uneven == "pad" and len(self._first) < n - 1:
            self._first += _single_rows(_rows_after(block, self._carried), n - 1 - len(self._first))
        total = self._carried + sum(len(chunk) for chunk in chunks)
        whole = total - total % n
        self._carry, self._carried = _rows_after(block, whole), total - whole
        start = self._next
        self._next += whole
        if not whole:
            return []
        return self._shares(epoch, start, block, whole // n)

    def finish_epoch(self, epoch: int) -> list[RankShare]:
        """The epoch has no more items: pad or drop its last, partial round."""
        carry, self._carry, self._carried = self._carry, [], 0
        # Its first rows are let go too: a sample (a run of the shared-memory pool) held
        # for padding must not stay held once its epoch is over.
        first, self._first = self._first, []
        if not carry or epoch != self._epoch:
            return []
        if self.uneven == "drop":
            return []
        n = self.world_size
        rows = _single_rows(carry, n)
        first = first or rows
        # A tiny epoch (fewer samples than ranks) repeats its samples as often as needed.
        padding = [first[i % len(first)] for i in range(n - len(rows))]
        return self._shares(epoch, self._next, rows + padding, 1)

    def _shares(self, epoch: int, start: int, block: list[_Rows], steps: int) -> list[RankShare]:
        """Each rank's rows of the first ``steps`` rounds of ``block`` (from position ``start``)."""
        n = self.world_size
        shares = []
        for rank in range(n):
            tags = np.empty((steps, 2), dtype=np.int64)
            tags[:, 0] = epoch
            tags[:, 1] = np.arange(start + rank, start + rank + n * steps, n)
            shares.append(RankShare(rank, tags, take_samples(_rank_rows(block, rank, n, steps))))
        return self._skip_had(shares) if self.ahead else shares

    def _skip_had(self, shares: list[RankShare]) -> list[RankShare]:
        """Leave out of each share what a rank that is :attr:`ahead` already had."""
        kept = []
        for share in shares:
            where = self.ahead.get(share.rank)
            if where is not None and len(share.items):
                epoch, position = where
                if int(share.tags[0, 0]) > epoch:
                    del self.ahead[share.rank]  # past it: deal this rank everything again
                else:
                    # A share's positions ascend: what the rank had is a prefix of it.
                    had = (int(np.searchsorted(share.tags[:, 1], position))
                           if int(share.tags[0, 0]) == epoch else len(share.items))
                    share = RankShare(share.rank, share.tags[had:],
                                      take_samples([(share.items, slice(had, None))]))
            kept.append(share)
        return kept


def _rows_after(block: list[_Rows], offset: int) -> list[_Rows]:
    """The rows of ``block`` from its ``offset``-th row on."""
    rest = []
    for chunk, start, stop in block:
        if offset < stop - start:
            rest.append((chunk, start + max(offset, 0), stop))
        offset -= stop - start
    return rest


def _single_rows(ranges: list[_Rows], count: int) -> list[_Rows]:
    """The first ``count`` rows of ``ranges`` (or all, if fewer), one range per row."""
    rows: list[_Rows] = []
    for chunk, start, stop in ranges:
        last = min(stop, start + count - len(rows))
        rows += [(chunk, row, row + 1) for row in range(start, last)]
    return rows


def _rank_rows(block: list[_Rows], rank: int, world_size: int,
               steps: int) -> list[tuple[Sequence[Any], slice]]:
    """The rows of ``block`` that ``rank`` gets in its first ``steps`` rounds, per chunk:
    the rows ``rank, rank + n, ...`` of the block, a strided slice of each chunk."""
    parts = []
    offset, end = 0, world_size * steps  # offset: the block row the chunk starts at
    for chunk, start, stop in block:
        if offset >= end:
            break
        first = offset + (rank - offset) % world_size  # the rank's first block row in it
        last = min(offset + stop - start, end)
        if first < last:
            parts.append((chunk, slice(start + first - offset, start + last - offset, world_size)))
        offset += stop - start
    return parts
