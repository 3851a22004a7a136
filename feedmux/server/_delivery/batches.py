"""Training batches built on the server: which samples form each trainer's batch.

A trainer that asks for ``batch_size=B`` in its hello gets every data message
as one or several batches of its training step. A batch shape is a trainer's
own: free trainers with different batch sizes (or none) read one server at
once (their batches are cut as they are dealt, :mod:`.freebatches`), and the
ranks of one data-parallel job share theirs. This module owns the pure
pieces: :class:`BatchRequest`, the batch shape of one ranked job (the server's
own, or a ranked group's: its first rank's hello fixes it; a rank asking for
another is refused, naming both), and :class:`BatchAssembler`, the stage that
cuts what one destination (a batch shape of free trainers, or one rank) is
dealt into batches of ``B`` consecutive samples, a batch never spanning two
epochs, the last partial batch of an epoch sent or dropped (``drop_last``,
counted). A stage that chooses other samples for a batch (by length, say)
takes the assembler's place behind the same two calls,
:meth:`~BatchAssembler.add` and :meth:`~BatchAssembler.finish_epoch`. It never
encodes, sends or decides who holds a rank.

With ranks the dealing comes first: the rank dealer evens the epoch's shares
(``uneven``: pad or drop the last round), then each rank's share is cut into
batches. Every share has the same length, so every rank gets the same number
of batches, of the same sizes, and step ``k`` of every rank holds the rounds
``k*B .. (k+1)*B - 1`` of the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ProtocolError
from feedmux.protocol import Hello, SampleBatch, take_samples, training_batch
from feedmux.server.config import BucketSpec

__all__ = ["MAX_BATCH_SIZE", "Batch", "BatchAssembler", "BatchRequest", "Batches", "UnknownLength",
           "unstackable"]

#: The error type of a refused batch shape (the same as a refused rank's).
BATCH_REFUSED = "feedmux.errors.ConfigurationError"
#: The largest batch a server builds: a hello names it, and anyone who can reach the
#: control port can send one (the server holds a batch's samples until it is complete).
MAX_BATCH_SIZE = 1 << 20
#: The longest ``bucket_by`` field name a hello may carry.
MAX_BUCKET_KEY = 256


class UnknownLength(ProtocolError):
    """A sample dealt to a free trainer's buckets has no length in the field its
    ``bucket_by`` names: that trainer's batch cannot be built."""


class BatchRequest:
    """The batch shape of one ranked job's trainers: ``batch_size`` (0: no batches) and
    ``drop_last``, fixed by its first rank's hello. A free trainer's hello is only
    checked: its shape is its own.

    Examples
    --------
    >>> request = BatchRequest()
    >>> request.admit(Hello("a", batch_size=32, rank=0, world_size=2)) is None
    True
    >>> request.admit(Hello("f", batch_size=8)) is None, request.batch_size
    (True, 32)
    >>> request.admit(Hello("b", batch_size=16, rank=1, world_size=2))[1]
    'the ranks of this job are dealt batches of batch_size=32, drop_last=False (its first \
rank asked for them): expected the same from rank 1 (trainer b), got batch_size=16, \
drop_last=False'
    """

    def __init__(self) -> None:
        self.batch_size = 0
        self.drop_last = False
        #: The sample field the ranks deal steps by (``bucket_by=``; "": none), fixed with
        #: the shape; ``default_bucket_by`` is the server's (``--bucket-by``), taken by a
        #: hello that names none.
        self.bucket_by = ""
        self.default_bucket_by = ""
        self._fixed = False
        self._run: Batches | None = None  # the assemblers of the current run
        self._dropped_before = 0  # what the runs before it dropped (a restarted job)

    def refusal(self, hello: Hello) -> tuple[str, str] | None:
        """Why ``hello``'s trainer cannot be served its batches here, or None."""
        size, drop = hello.batch_size, hello.drop_last
        if not 0 <= size <= MAX_BATCH_SIZE or (drop and not size):
            return BATCH_REFUSED, (f"expected batch_size 1 .. {MAX_BATCH_SIZE} (or 0 and "
                                  f"drop_last False), got batch_size={size}, drop_last={drop}")
        key = self.key_of(hello)
        if key and (refused := _bucket_refusal(hello, key)) is not None:
            return BATCH_REFUSED, refused
        if hello.rank >= 0 and self._fixed and (size, drop, key) != (
                self.batch_size, self.drop_last, self.bucket_by):
            asked = f"batch_size={size}, drop_last={drop}" + (f", bucket_by={key!r}" * bool(key))
            return BATCH_REFUSED, (
                f"the ranks of this job are dealt {self.describe()} (its first rank asked for "
                f"them): expected the same from rank {hello.rank} (trainer {hello.client_id}), "
                f"got {asked}")
        return None

    def key_of(self, hello: Hello) -> str:
        """The field ``hello``'s trainer has its steps dealt by: its own ``bucket_by``, or
        the server's for a ranked trainer with batches that names none ("": no buckets)."""
        if hello.bucket_by or hello.rank < 0 or not hello.batch_size:
            return hello.bucket_by
        return self.default_bucket_by

    def admit(self, hello: Hello) -> tuple[str, str] | None:
        """Check ``hello`` and fix the shape if it is the job's first rank; ``(error type,
        message)`` when it is refused."""
        refused = self.refusal(hello)
        if refused is None and not self._fixed and hello.rank >= 0:
            self.batch_size, self.drop_last, self._fixed = hello.batch_size, hello.drop_last, True
            self.bucket_by = self.key_of(hello)
        return refused

    def assemblers(self, buckets: BucketSpec | None = None) -> Batches | None:
        """A run's batch assemblers, or None when the trainers asked for no batches;
        ``buckets`` is the server's window, edges and seed for a job that deals steps by
        length (the field is the one the ranks asked for)."""
        if not self.batch_size:
            return None
        if self._run is not None:
            self._dropped_before += self._run.dropped
        spec = None
        if self.bucket_by:
            spec = (buckets or BucketSpec(self.bucket_by))._replace(key=self.bucket_by)
        self._run = Batches(self.batch_size, self.drop_last, spec)
        return self._run

    def bucket_stats(self) -> dict[str, int]:
        """The coordinated steps' counters of the current run (none without ``bucket_by``)."""
        return {} if self._run is None else self._run.bucket_counts()

    @property
    def dropped(self) -> int:
        """Samples of epochs' last, partial batches dropped (``drop_last``) so far."""
        return self._dropped_before + (0 if self._run is None else self._run.dropped)

    def forget(self) -> None:
        """The job is over (a ranked job restarted from a checkpoint, a group dropped): the
        next first rank fixes the shape anew."""
        self.batch_size, self.drop_last, self.bucket_by, self._fixed = 0, False, "", False

    def describe(self) -> str:
        if not self.batch_size:
            return "no batches (batch_size=0)"
        buckets = f", bucket_by={self.bucket_by!r}" if self.bucket_by else ""
        return f"batches of batch_size={self.batch_size}, drop_last={self.drop_last}{buckets}"


def unstackable(error: Exception, epoch: int, batch_size: int, ranked: bool = False,
                bucket_by: str = "") -> str:
    """What a trainer is told when the samples of its batch do not stack.

    Examples
    --------
    >>> unstackable(ValueError("got sample 1 of 16 (int64[3]) unlike sample 0"), 2, 16)[:74]
    'cannot build a batch of batch_size=16 in epoch 2: its samples do not stack'
    >>> unstackable(UnknownLength("bucket_by='n': expected ..."), 2, 16, bucket_by="n")[:88]
    "cannot build a batch of batch_size=16, bucket_by='n' in epoch 2: bucket_by='n': expected"
    """
    shape = f"batch_size={batch_size}" + (f", bucket_by={bucket_by!r}" * bool(bucket_by))
    why = str(error) if isinstance(error, UnknownLength) else (
        f"its samples do not stack ({error})")
    return (f"cannot build a batch of {shape} in epoch {epoch}: {why}; for samples of "
            f"variable length, have the server batch them by length "
            "with RemoteLoader(batch_size=..., bucket_by='<the length field>', pad=True) "
            "(docs/ddp.md), or use batch_size=None and batch in the trainer. "
            + ("A data-parallel job's ranks take their steps together: the run stops"
               if ranked else "This loader is dealt nothing more; its samples go to the "
                              "server's other trainers"))


def _bucket_refusal(hello: Hello, key: str) -> str | None:
    """Why ``hello``'s trainer cannot have its steps dealt by ``key``, or None."""
    if len(key) > MAX_BUCKET_KEY:
        return f"expected bucket_by at most {MAX_BUCKET_KEY} characters, got {len(key)}"
    if not hello.batch_size:
        return (f"bucket_by groups samples of similar length into the batches the server "
                f"builds: expected batch_size= with bucket_by={key!r}, got batch_size=0 from "
                f"trainer {hello.client_id}")
    if hello.rank >= 0 and hello.resume and hello.resume[2] != hello.world_size:
        return (f"a job dealt by bucket_by resumes with the world size of its checkpoint (its "
                f"steps hold world_size x batch_size samples): expected world_size "
                f"{hello.resume[2]}, got {hello.world_size} from rank {hello.rank}")
    return None


class Batch(NamedTuple):
    """Consecutive batches for one destination, one data message: ``tags`` (rows of
    (epoch, position)) and ``items`` (a :class:`~feedmux.protocol.SampleBatch` with
    every number stacked). It holds whole batches of ``batch_size`` but for an
    epoch's last, short one, at its end: the trainer cuts it at every
    ``batch_size`` rows."""

    tags: np.ndarray
    items: SampleBatch


class BatchAssembler:
    """Cuts the samples dealt to one destination into batches of ``batch_size``.

    Feed it the samples of an epoch in order (:meth:`add`, any piece sizes),
    then call :meth:`finish_epoch`. It keeps pieces of what it was given (row
    ranges), not samples, and joins them only to complete a batch; the whole
    batches of a piece come out together (one message for several batches).

    Examples
    --------
    >>> import numpy as np
    >>> def tagged(epoch, start, count):
    ...     tags = np.empty((count, 2), dtype=np.int64)
    ...     tags[:, 0], tags[:, 1] = epoch, np.arange(start, start + count)
    ...     return tags
    >>> assembler = BatchAssembler(2, drop_last=False)
    >>> [b.tags[:, 1].tolist() for b in assembler.add(tagged(1, 0, 3), [1, 2, 3])]
    [[0, 1]]
    >>> [b.tags[:, 1].tolist() for b in assembler.add(tagged(1, 3, 6), [4, 5, 6, 7, 8, 9])]
    [[2, 3], [4, 5, 6, 7]]
    >>> [(b.tags[:, 1].tolist(), b.items.stacked().tolist()) for b in assembler.finish_epoch()]
    [([8], [9])]
    """

    #: Its batches follow the positions: a row earlier than those held ends the batch begun.
    ordered = True

    def __init__(self, batch_size: int, drop_last: bool) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        #: Samples of epochs' last, partial batches that were dropped (drop_last).
        self.dropped = 0
        self._pieces: list[tuple[np.ndarray, Sequence[Any]]] = []
        self._held = 0

    @property
    def held(self) -> int:
        """Samples of a batch begun and not complete yet."""
        return self._held

    def add(self, tags: np.ndarray, items: Sequence[Any]) -> list[Batch]:
        """The batches that ``items`` (tagged ``tags``, the next of the epoch) complete:
        the one begun before (if any), then the piece's whole batches together.

        Raises :class:`~feedmux.errors.ProtocolError` when they do not stack: it then
        holds what it held before."""
        pieces, held = list(self._pieces), self._held
        try:
            return self._add(tags, items)
        except ProtocolError:
            self._pieces, self._held = pieces, held
            raise

    def _add(self, tags: np.ndarray, items: Sequence[Any]) -> list[Batch]:
        size, count = self.batch_size, len(items)
        out: list[Batch] = []
        start = 0
        if self._held:
            start = min(size - self._held, count)
            self._pieces.append((tags[:start], _rows(items, 0, start)))
            self._held += start
            if self._held < size:
                return out
            out.append(self._joined())
        stop = start + (count - start) // size * size
        if stop > start:
            out.append(_batch(tags[start:stop], _rows(items, start, stop)))
        if stop < count:
            self._pieces.append((tags[stop:], _rows(items, stop, count)))
            self._held = count - stop
        return out

    def pieces(self) -> list[tuple[np.ndarray, Sequence[Any]]]:
        """The rows held, as the ``(tags, samples)`` pieces they came in (a copy of the
        list: what a failed :meth:`add` held before it)."""
        return list(self._pieces)

    def held_tags(self) -> np.ndarray:
        """The tags of the rows held."""
        if not self._pieces:
            return np.zeros((0, 2), dtype=np.int64)
        return np.concatenate([tags for tags, _ in list(self._pieces)])

    def finish_epoch(self, keep_short: bool = False) -> list[Batch]:
        """The epoch has no more samples: its last, partial batch (or nothing, dropped;
        ``keep_short``: whatever ``drop_last`` says, as when the rows are given back)."""
        if not self._held:
            return []
        if self.drop_last and not keep_short:
            self.dropped += self._held
            self._pieces, self._held = [], 0
            return []
        return [self._joined()]

    def _joined(self) -> Batch:
        pieces, self._pieces, self._held = self._pieces, [], 0
        if len(pieces) == 1:
            return _batch(*pieces[0])
        tags = np.concatenate([tags for tags, _ in pieces])
        return _batch(tags, take_samples([(items, slice(None)) for _, items in pieces]))


def _rows(items: Sequence[Any], start: int, stop: int) -> Sequence[Any]:
    if start == 0 and stop == len(items):
        return items
    return take_samples([(items, slice(start, stop))])


def _batch(tags: np.ndarray, items: Sequence[Any]) -> Batch:
    return Batch(tags, training_batch(items))


class Batches:
    """The assemblers of one server run, one per destination (-1: the free trainers; a
    rank), all of one shape; with ``buckets`` the ranked stage deals whole steps by length
    instead (:mod:`.bucketstage`) and counts what it drops in :attr:`bucket_dropped`."""

    def __init__(self, batch_size: int, drop_last: bool,
                 buckets: BucketSpec | None = None) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.buckets = buckets
        #: Samples of bucketed epochs' last, partial batches dropped (drop_last).
        self.bucket_dropped = 0
        #: The coordinated steps' counters (``bucket_by``; set by the ranked stage): samples
        #: padded or dropped by ``uneven``, steps dealt from a full window or bucket, late.
        self.bucket_counts: Callable[[], dict[str, int]] = dict
        self._assemblers: dict[int, BatchAssembler] = {}

    def of(self, destination: int) -> BatchAssembler:
        assembler = self._assemblers.get(destination)
        if assembler is None:
            assembler = self._assemblers[destination] = BatchAssembler(self.batch_size,
                                                                       self.drop_last)
        return assembler

    def finish_epoch(self) -> list[tuple[int, Batch]]:
        """Every destination's last batch of the epoch, in destination order."""
        return [(destination, batch) for destination in sorted(self._assemblers)
                for batch in self._assemblers[destination].finish_epoch()]

    @property
    def dropped(self) -> int:
        return self.bucket_dropped + sum(assembler.dropped
                                         for assembler in self._assemblers.values())
