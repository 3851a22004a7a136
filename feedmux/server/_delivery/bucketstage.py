"""Batches by length: the ranked stage's coordinated steps, and a free trainer's buckets.

When the ranks asked for ``bucket_by=KEY`` (with ``batch_size=B``), the
ranked stage (:mod:`.ranking`) hands every row of an epoch to a
:class:`BucketStage` instead of the round-by-round dealer. This module owns
what comes around the pure window of :mod:`.buckets`: each sample's length
read from its field ``KEY`` (an int, or an array's first dimension), the
resume of a job from a checkpoint (the window is a function of the seeded
stream, so the resumed epoch is sampled again from its start and the steps
dealt before the job's position are left out), the ranks that are ahead (a
live rank of a restarted server gets nothing it had), the epoch's last,
partial batches sent or dropped (``drop_last``, counted), and each rank's
batch built with its length-led leaves padded
(:func:`~feedmux.protocol.padded_batch`). A free trainer that asks
``bucket_by=`` has what it is dealt cut by the same window, for a job of one
rank (a step is one batch): :class:`BucketAssembler` takes the place of
:class:`~feedmux.server._delivery.batches.BatchAssembler` in its batch shape,
each batch's rows keeping their own tags (sorted by position: a batch's rows
are acknowledged as any message's). It is pure and must never encode, send or
decide who holds a rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from feedmux.errors import ConfigurationError, ProtocolError
from feedmux.protocol import (
    SampleBatch,
    StackedLeaf,
    gathered,
    padded_batch,
    stacked_batch,
    training_batch,
)
from feedmux.server._delivery.batches import Batch, Batches, UnknownLength
from feedmux.server._delivery.buckets import BucketWindow, Step
from feedmux.server._delivery.dealing import RankShare
from feedmux.server.config import BucketSpec

__all__ = ["BucketAssembler", "BucketStage", "sample_length", "sample_lengths"]

_INTS = frozenset({int, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32,
                   np.uint16, np.uint8})


def sample_lengths(samples: Sequence[Any], key: str) -> np.ndarray:
    """The lengths of ``samples`` by their field ``key`` (:func:`sample_length`), read at C
    level when every sample is a dict with an int, or an array, there.

    Examples
    --------
    >>> import numpy as np
    >>> sample_lengths([{"n": 3}, {"n": np.int64(5)}], "n").tolist()
    [3, 5]
    >>> sample_lengths([{"x": np.zeros(2)}, {"x": np.zeros((4, 3))}], "x").tolist()
    [2, 4]
    """
    try:
        values = list(map(itemgetter(key), samples))
    except (KeyError, TypeError, IndexError):
        values = None
    if values is not None:
        kinds = set(map(type, values))
        if kinds <= _INTS and kinds:
            lengths = np.array(values, dtype=np.int64)
            if not len(lengths) or lengths.min() >= 0:
                return lengths
        elif kinds == {np.ndarray} and all(value.ndim for value in values):
            return np.fromiter(map(len, values), np.int64, len(values))
    return np.array([sample_length(sample, key) for sample in samples], dtype=np.int64)



def sample_length(sample: Any, key: str) -> int:
    """The length of ``sample`` by its field ``key``: an int there, or an array's first
    dimension.

    Examples
    --------
    >>> import numpy as np
    >>> sample_length({"tokens": np.zeros(7)}, "tokens"), sample_length({"n": 3}, "n")
    (7, 3)
    >>> sample_length({"x": 1}, "n")
    Traceback (most recent call last):
    ...
    feedmux.errors.ConfigurationError: bucket_by='n': expected each sample a dict whose 'n' \
is its length (an int >= 0, or an array: its first dimension), got a dict with keys ['x']
    """
    value = sample.get(key) if type(sample) is dict else None
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return int(value.shape[0])
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    if type(sample) is dict and key in sample:
        got = f"{key!r}: {type(value).__name__} {value!r:.40}"
    elif type(sample) is dict:
        got = f"a dict with keys {sorted(map(str, sample))[:8]}"
    else:
        got = f"a {type(sample).__name__}"
    raise ConfigurationError(
        f"bucket_by={key!r}: expected each sample a dict whose {key!r} is its length (an int "
        f">= 0, or an array: its first dimension), got {got}")


class BucketStage:
    """Deals each epoch's rows to ``world_size`` ranks a coordinated step at a time.

    Feed it the rows of an epoch in order (:meth:`deal`), then call
    :meth:`finish_epoch`; each returns the shares (one batch each, its rows'
    tags the dealt positions of :mod:`.buckets`) of the steps the rows
    completed, in turns across the ranks (each rank's first share, then each
    one's second, ...). ``start`` (a job resumed at ``(epoch,
    position)``): the source samples that epoch again from its start, and what
    was dealt before ``position`` is left out. ``ahead``: rank -> (epoch,
    position) it stands at, nothing before dealt to it again.

    Examples
    --------
    >>> from feedmux.server._delivery.batches import Batches
    >>> from feedmux.server.config import BucketSpec
    >>> stage = BucketStage(2, "pad", Batches(2, False, BucketSpec("n", window=4)))
    >>> rows = [{"n": n} for n in (5, 1, 9, 2, 4)]
    >>> [(s.rank, s.tags[:, 1].tolist()) for s in stage.deal(1, rows)]
    [(0, [0, 2]), (1, [1, 3])]
    >>> [(s.rank, s.tags[:, 1].tolist(), s.items.stacked()["n"].tolist())
    ...  for s in stage.finish_epoch(1)]
    [(0, [4], [4]), (1, [5], [4])]
    """

    def __init__(self, world_size: int, uneven: str, batches: Batches,
                 start: tuple[int, int] | None = None,
                 ahead: Mapping[int, tuple[int, int]] | None = None) -> None:
        spec = batches.buckets or BucketSpec("")
        self.key = spec.key
        self.batches = batches
        self.window = BucketWindow(world_size, batches.batch_size, spec.window, spec.edges,
                                   uneven, spec.seed, row_dtype=np.int64)
        self.start = start
        self.ahead: dict[int, tuple[int, int]] = dict(ahead or {})
        self.chunks = _Chunks()
        batches.bucket_counts = self.counts

    def counts(self) -> dict[str, int]:
        """What the window did so far, for the server's stats."""
        window = self.window
        return {"bucket_window": window.window, "bucket_held": window.held,
                "bucket_padded": window.padded, "bucket_uneven_dropped": window.dropped,
                "bucket_window_steps": window.window_steps,
                "bucket_full_bucket_steps": window.bucket_steps,
                "bucket_late_steps": window.late_steps}

    def deal(self, epoch: int, rows: Sequence[Any]) -> list[RankShare]:
        """The shares of the steps that ``rows`` (the next of ``epoch``) complete."""
        if type(rows) is SampleBatch:  # its rows held as references: no sample built
            chunk = training_batch(rows)  # its numbers as arrays, gathered at C level
            steps = self.window.add(epoch, _stacked_lengths(chunk, self.key),
                                    self.chunks.refs(chunk))
        else:
            steps = self.window.add(epoch, sample_lengths(rows, self.key),
                                    self.chunks.samples(rows))
        return self._shares(steps, last=False)

    def finish_epoch(self, epoch: int) -> list[RankShare]:
        """``epoch`` has no more rows: the rest of the window, its last batches evened."""
        return self._shares(self.window.finish_epoch(epoch), last=True)

    def _shares(self, steps: list[Step], last: bool) -> list[RankShare]:
        """Each rank's batches of ``steps`` (all of one epoch), a rank's run of whole batches
        in one message when they stack without padding (small samples: what a message costs
        is shared by its batches), else one message per batch."""
        size, drop_last = self.batches.batch_size, self.batches.drop_last
        n = self.window.world_size
        resumed = self.start is not None or bool(self.ahead)
        per_rank: list[list[RankShare]] = []
        for rank in range(n):
            pieces: list[tuple[int, np.ndarray, np.ndarray]] = []
            for step in steps:
                rows = step.ranks[rank]
                if last and drop_last and len(rows) < size:
                    self.batches.bucket_dropped += len(rows)
                    continue
                had = self._had(step.epoch, rank, step.start + rank, len(rows), n) if resumed else 0
                if had < len(rows):
                    first = step.start + rank + had * n
                    pieces.append((first, rows[had:], step.lengths[rank][had:]))
            per_rank.append(_joined(rank, steps[0].epoch, n, pieces, size, self.chunks)
                            if pieces else [])
        # Step by step across the ranks, not rank by rank: a rank whose lane is full (its
        # trainer stopped reading, or left for a successor) holds the others up by one
        # message at most, not by a whole pass of its batches that they never get.
        shares = [share for turn in itertools.zip_longest(*per_rank) for share in turn
                  if share is not None]
        if steps:
            self.chunks.dealt([rows for step in steps for rows in step.ranks])
            self.chunks.keep(self.window.rows())
        return shares

    def _had(self, epoch: int, rank: int, first: int, count: int, n: int) -> int:
        """How many of a rank's ``count`` rows at positions ``first + j * n`` it had: those
        before the resume position, or before where a rank that is ahead stands."""
        cut = 0
        for where in (self.start, self.ahead.get(rank)):
            if where is not None and epoch == where[0]:
                cut = max(cut, min(count, -(-(where[1] - first) // n)))
            elif where is not None and epoch < where[0]:
                cut = count
        return cut


class BucketAssembler:
    """Cuts the samples dealt to one free batch shape into batches of ``batch_size`` samples
    of similar length, by the window of :mod:`.buckets` for one rank.

    Feed it the samples of an epoch (:meth:`add`, any piece sizes, positions in any
    order), then call :meth:`finish_epoch`: what the window holds goes out in length
    order, whole batches then the last, short one of each bucket (dropped with
    ``drop_last``, counted in :attr:`dropped`). ``buckets`` is the field that gives a
    sample's length, the window in samples (0:
    :data:`~feedmux.server._delivery.buckets.DEFAULT_WINDOW_STEPS` batches), the edges and
    the seed. Each batch is one message, its rows sorted by
    position and keeping their tags, its length-led leaves padded
    (:func:`~feedmux.protocol.padded_batch`). A failed :meth:`add` (samples that do not
    stack, or without the field) raises :class:`~feedmux.errors.ProtocolError`;
    :meth:`pieces` then gives the rows held before it, and the assembler is fed no more.

    Examples
    --------
    >>> import numpy as np
    >>> tags = np.array([[1, p] for p in range(5)])
    >>> assembler = BucketAssembler(2, False, BucketSpec("n", window=4))
    >>> [b.tags[:, 1].tolist() for b in assembler.add(tags, [{"n": n} for n in (5, 1, 9, 2, 6)])]
    [[0, 2]]
    >>> [(b.tags[:, 1].tolist(), b.items.stacked()["n"].tolist()) for b in assembler.finish_epoch()]
    [([1, 3], [1, 2]), ([4], [6])]
    """

    #: Its batches do not follow the positions (a row of an earlier position is no batch's
    #: end: it waits in the window as any other).
    ordered = False

    def __init__(self, batch_size: int, drop_last: bool, buckets: BucketSpec) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.key = buckets.key
        self.window = BucketWindow(1, batch_size, buckets.window, buckets.edges, "pad",
                                   buckets.seed, row_dtype=np.int64)
        #: Samples of epochs' last, partial batches that were dropped (drop_last).
        self.dropped = 0
        self.chunks = _Chunks()
        self._tags: dict[int, np.ndarray] = {}  # each chunk's tags, by its serial
        self._epoch = 0
        self._before: np.ndarray | None = None  # the rows held before a failed add

    @property
    def held(self) -> int:
        """Samples held in the window."""
        return self.window.held

    def add(self, tags: np.ndarray, items: Sequence[Any]) -> list[Batch]:
        """The batches that ``items`` (tagged ``tags``, the next of the epoch) complete."""
        if not len(tags):
            return []
        before = self.window.rows()
        try:
            if type(items) is SampleBatch:  # its rows held as references: no sample built
                chunk = training_batch(items)
                lengths, rows = _stacked_lengths(chunk, self.key), self.chunks.refs(chunk)
            else:
                lengths, rows = sample_lengths(items, self.key), self.chunks.samples(items)
            self._tags[int(rows[0]) >> 32] = tags
            self._epoch = int(tags[0, 0])
            return self._batches(self.window.add(self._epoch, lengths, rows), last=False)
        except (ProtocolError, ConfigurationError) as error:
            self._before = before
            if isinstance(error, ProtocolError):
                raise
            raise UnknownLength(str(error)) from error

    def finish_epoch(self, keep_short: bool = False) -> list[Batch]:
        """The epoch has no more samples: the window's rows, whole batches then the last,
        partial one of each bucket (or nothing of it, dropped; ``keep_short``: whatever
        ``drop_last`` says, as when the rows are given back)."""
        return self._batches(self.window.finish_epoch(self._epoch, by_bucket=True), last=True,
                             drop=self.drop_last and not keep_short)

    def pieces(self) -> list[tuple[np.ndarray, Sequence[Any]]]:
        """The rows held (those held before a failed :meth:`add`), as ``(tags, samples)``
        pieces in position order, a piece per message they came in (built: a slow path,
        for rows given back to the others)."""
        held = self.window.rows() if self._before is None else self._before
        if not len(held):
            return []
        held = np.sort(held)  # by chunk, then by row (a message's rows in position order)
        serials = held >> 32
        starts = np.flatnonzero(np.r_[True, serials[1:] != serials[:-1]]).tolist()
        stops = [*starts[1:], len(held)]
        return [(self._tags_of(held[start:stop]), self.chunks.samples_of(held[start:stop]))
                for start, stop in zip(starts, stops, strict=True)]

    def held_tags(self) -> np.ndarray:
        """The tags of the rows held, in position order."""
        tags = self._tags_of(self.window.rows())
        return tags[np.lexsort((tags[:, 1], tags[:, 0]))]

    def _batches(self, steps: list[Step], last: bool, drop: bool = False) -> list[Batch]:
        """Each step's batch, its rows in position order (one message each); ``drop``: an
        epoch's last, short ones are dropped."""
        out = []
        for step in steps:
            rows, lengths = step.ranks[0], step.lengths[0]
            if last and drop and len(rows) < self.batch_size:
                self.dropped += len(rows)
                continue
            tags = self._tags_of(rows)
            order = np.lexsort((tags[:, 1], tags[:, 0]))
            out.append(Batch(tags[order], self.chunks.batch(rows[order], lengths[order])))
        if steps:
            self.chunks.dealt([step.ranks[0] for step in steps])
            held = self.window.rows()
            self.chunks.keep(held)
            oldest = int(held.min()) >> 32 if len(held) else None
            for serial in [serial for serial in self._tags if oldest is None or serial < oldest]:
                del self._tags[serial]
        return out

    def _tags_of(self, rows: np.ndarray) -> np.ndarray:
        """The tags of ``rows`` (row ``i`` of chunk ``c`` is ``c << 32 | i``), in their order."""
        out = np.empty((len(rows), 2), dtype=np.int64)
        serials, indices = rows >> 32, rows & 0xFFFFFFFF
        for serial in np.unique(serials).tolist():
            where = serials == serial
            out[where] = self._tags[serial][indices[where]]
        return out


def _joined(rank: int, epoch: int, n: int, pieces: list[tuple[int, np.ndarray, np.ndarray]],
            size: int, chunks: _Chunks) -> list[RankShare]:
    """A rank's batches (first position, rows, lengths; its rows ``n`` positions apart) as
    shares: consecutive whole ones (and a last, short one) joined when they stack without
    padding, the others one share each."""
    shares, run = [], 0
    while run < len(pieces):
        end = run + 1
        while end < len(pieces) and len(pieces[end - 1][1]) == size:
            end += 1
        batch = None
        if end - run > 1:
            rows = np.concatenate([piece for _, piece, _ in pieces[run:end]])
            lengths = np.concatenate([length for _, _, length in pieces[run:end]])
            batch = chunks.stacked(rows, lengths)
        if batch is not None:
            shares.append(RankShare(rank, _tags(epoch, n, pieces[run:end]), batch))
        else:
            for piece in pieces[run:end]:
                _, rows, lengths = piece
                shares.append(RankShare(rank, _tags(epoch, n, [piece]),
                                        chunks.batch(rows, lengths)))
        run = end
    return shares


def _tags(epoch: int, n: int, pieces: list[tuple[int, np.ndarray, np.ndarray]]) -> np.ndarray:
    """The (epoch, position) rows of ``pieces``' rows: the ``j``-th of a piece at its first
    position ``+ j * n``."""
    counts = np.array([len(rows) for _, rows, _ in pieces], dtype=np.int64)
    firsts = np.array([first for first, _, _ in pieces], dtype=np.int64)
    total = int(counts.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    tags = np.empty((total, 2), dtype=np.int64)
    tags[:, 0], tags[:, 1] = epoch, np.repeat(firsts, counts) + n * within
    return tags


def _stacked_lengths(batch: SampleBatch, key: str) -> np.ndarray:
    """The lengths of a stacked chunk's rows, from its stacked leaf ``key`` when it has one
    (an int column, or arrays of one shape), else from its samples."""
    template = batch.template
    leaf = template.get(key) if type(template) is dict else None
    if type(leaf) is StackedLeaf:
        values = leaf.values
        if type(values) is np.ndarray and values.ndim >= 2:
            return np.full(len(batch), values.shape[1], dtype=np.int64)
        if type(values) is list and set(map(type, values)) <= _INTS:
            values = np.array(values, dtype=np.int64)  # a column of plain ints
        if (type(values) is np.ndarray and values.ndim == 1 and values.dtype.kind in "iu"
                and (not len(values) or values.min() >= 0)):
            return values.astype(np.int64)
    return sample_lengths(batch.unstacked(), key)


class _Chunks:
    """The rows the window holds, by number: row ``i`` of the ``c``-th chunk fed is the int
    ``c << 32 | i``. The rows of a stacked chunk stay in it (a step's batch is gathered
    from the chunks' stacked leaves, with no sample built) until no row held is of it; the
    rows of a chunk of samples are held one by one until they are dealt."""

    def __init__(self) -> None:
        self._chunks: dict[int, SampleBatch] = {}
        self._loose: dict[int, Any] = {}
        self._next = 0

    def refs(self, batch: SampleBatch) -> np.ndarray:
        """The numbers of the rows of ``batch`` (its numbers stacked as arrays)."""
        serial, self._next = self._next, self._next + 1
        self._chunks[serial] = batch
        return (serial << 32) + np.arange(len(batch), dtype=np.int64)

    def samples(self, samples: Sequence[Any]) -> np.ndarray:
        """The numbers of ``samples``, each held until it is dealt (:meth:`dealt`)."""
        serial, self._next = self._next, self._next + 1
        codes = (serial << 32) + np.arange(len(samples), dtype=np.int64)
        self._loose.update(zip(codes.tolist(), samples, strict=True))
        return codes

    def dealt(self, rows: list[np.ndarray]) -> None:
        """Let go of the samples of ``rows`` (dealt: no longer in the window)."""
        if self._loose:
            loose = self._loose
            for code in np.concatenate(rows).tolist():
                loose.pop(code, None)

    def keep(self, held: np.ndarray) -> None:
        """Let go of the stacked chunks no row ``held`` is of."""
        oldest = int(held.min()) >> 32 if len(held) else self._next
        for serial in [serial for serial in self._chunks if serial < oldest]:
            del self._chunks[serial]

    def stacked(self, rows: np.ndarray, lengths: np.ndarray) -> SampleBatch | None:
        """``rows`` as one batch when they stack with no padding (rows of chunks always
        do: a chunk's rows are of one shape), else None."""
        batch = self._gathered(rows, lengths)
        return batch if batch is not None else stacked_batch(self.samples_of(rows), lengths)

    def batch(self, rows: np.ndarray, lengths: np.ndarray) -> SampleBatch:
        """``rows`` as one batch, padded where it must be."""
        batch = self._gathered(rows, lengths)
        return batch if batch is not None else padded_batch(self.samples_of(rows), lengths)

    def _gathered(self, rows: np.ndarray, lengths: np.ndarray) -> SampleBatch | None:
        """``rows`` gathered chunk by chunk and put back in their order, when every one is
        a row of a stacked chunk (of one layout), else None."""
        if not len(rows):
            return None
        serials, indices = rows >> 32, rows & 0xFFFFFFFF
        order = np.argsort(serials, kind="stable")
        ordered = serials[order]
        starts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()]
        stops = [*starts[1:], len(order)]
        held = self._chunks
        if any(int(ordered[start]) not in held for start in starts):
            return None
        parts = [(held[int(ordered[start])], indices[order[start:stop]])
                 for start, stop in zip(starts, stops, strict=True)]
        return gathered(parts, np.argsort(order), lengths)

    def samples_of(self, rows: np.ndarray) -> list[Any]:
        """The samples of ``rows``, built (what a stacked chunk's row is as a sample)."""
        chunks, loose = self._chunks, self._loose
        return [loose[row] if row in loose else chunks[row >> 32][row & 0xFFFFFFFF]
                for row in rows.tolist()]
