"""Free trainers' batches, cut as they are dealt: a batch shape is a trainer's own.

A free trainer that asks ``batch_size=B`` in its hello is dealt the sampled
stream by credit like any free trainer; what it is dealt goes through the
batches of its shape (``(B, drop_last, bucket_by)``) in its audience (the
server's free trainers, or one consumer group's), and it is sent whole batches:
of consecutive samples, or with ``bucket_by`` of samples of similar length (the
window of the ranked path's coordinated steps, for one rank:
:class:`~feedmux.server._delivery.bucketstage.BucketAssembler`). So loaders
with different batch sizes, and loaders without one, read one stream at once,
each its share; the sampler and the groups' buffer never know a batch size.

This module owns :class:`FreeBatches`, the pure part: per shape a
:class:`~feedmux.server._delivery.batches.BatchAssembler` (rows held until a
batch is complete, a batch never spanning two epochs nor going back in the
epoch's positions), or a bucket assembler (rows held in its window until a
bucket makes a batch or the epoch ends), and the batches built and not sent
yet, encoded. The rows a shape holds are no trainer's: when a trainer dies,
what it was sent goes back through its ledger as before (a bucketed batch
dealt again is cut as its samples), and what its shape holds goes to the next
trainer of that shape; a shape with no trainer left gives its rows back as
sample messages (:meth:`FreeBatches.release`), dealt again to the others. An
epoch's last, partial batch (of each bucket) is made when the epoch is over
(:meth:`FreeBatches.finish_epoch`), sent short or dropped (``drop_last``).
It never sends, and never decides which trainer takes a message (the dealer
does, by credit).

What a shape holds was dealt (the sampler and the server's counts have it as
sent) and is in no trainer's ledger: no trainer has it, so none can report it
or acknowledge it. A restarted server knows of it only through the summary of
the hand-outs (docs/resume.md), which must list it as not handed out
(:meth:`FreeBatches.outstanding`): positions below the newest message dealt
that a summary does not list count as handed out, and a shape holds rows
below it whenever a trainer of another shape, or of none, took later
messages meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    Data,
    decode,
    encode,
    position_runs,
    read_tags,
    without_padding,
)
from feedmux.server._delivery.batches import Batch, BatchAssembler
from feedmux.server._delivery.bucketstage import BucketAssembler
from feedmux.server.config import BucketSpec

__all__ = ["NO_BATCHES", "FreeBatches", "Shape"]

#: A free trainer's batch shape: ``(batch_size, drop_last, bucket_by)`` ("": batches of
#: consecutive samples).
Shape = tuple[int, bool, str]
#: The shape of a trainer that takes single samples.
NO_BATCHES: Shape = (0, False, "")


class _ShapeCut:
    """One shape's assembler, where its held rows stand, and its batches not sent yet."""

    def __init__(self, shape: Shape, buckets: BucketSpec) -> None:
        size, drop_last, key = shape
        self.assembler: BatchAssembler | BucketAssembler = (
            BucketAssembler(size, drop_last, buckets._replace(key=key)) if key
            else BatchAssembler(size, drop_last))
        #: ``(epoch, position)`` of the last row held (None: nothing held).
        self.last: tuple[int, int] | None = None
        #: Encoded batches, oldest first, each with its sample count and epoch.
        self.pending: deque[tuple[list[Any], int, int]] = deque()


class FreeBatches:
    """The batches of one free audience, a cut per batch shape its trainers asked for.

    ``shape_of(client_id)`` is a trainer's shape, by its client id as bytes
    (:data:`NO_BATCHES`: single samples); ``buckets`` the window, edges and seed of the
    shapes with a ``bucket_by`` (the server's).

    Examples
    --------
    >>> import numpy as np
    >>> def message(epoch, start, count):
    ...     tags = np.array([[epoch, p] for p in range(start, start + count)])
    ...     return list(encode(Data(tags, [{"y": p} for p in range(start, start + count)])))
    >>> batches = FreeBatches("s", lambda client_id: (2, False, ""))
    >>> batches.cut((2, False, ""), message(1, 0, 3))
    >>> [count for _, count, _ in batches.pending_of((2, False, ""))]
    [2]
    >>> batches.outstanding()  # dealt and sent to nobody: one batch built, one row held
    [(1, 0, 2), (1, 2, 3)]
    >>> batches.finish_epoch(1)
    >>> [count for _, count, _ in batches.pending_of((2, False, ""))]
    [2, 1]
    """

    def __init__(self, server_id: str, shape_of: Callable[[bytes], Shape],
                 buckets: BucketSpec | None = None) -> None:
        self.server_id = server_id
        self.shape_of = shape_of
        self.buckets = buckets or BucketSpec("")
        self._cuts: dict[Shape, _ShapeCut] = {}
        #: Trainers told their batch could not be built: dealt nothing more.
        self.refused: set[bytes] = set()
        #: Samples of epochs' last partial batches left out (``drop_last``).
        self.dropped = 0
        #: Samples that made no batch of their trainer's shape and that no trainer of
        #: another shape was there to take: dropped (the dealer counts them).
        self.unbuilt = 0
        #: Rows held when a batch could not be built, as sample messages with the shape
        #: they did not stack into: the dealer deals them to the others (:meth:`cut`).
        self.returned: list[tuple[Shape, list[Any]]] = []
        self._bucketed = False

    @property
    def bucketed(self) -> bool:
        """Whether a trainer of this audience asked for buckets and was dealt a message
        (a lost trainer's rest may then hold a bucketed batch, padded)."""
        return self._bucketed

    @property
    def cut_any(self) -> bool:
        """Whether a trainer of this audience asked for batches and was dealt a message."""
        return bool(self._cuts) or bool(self.dropped or self.unbuilt)

    def shape(self, client_id: bytes) -> Shape:
        return self.shape_of(client_id)

    def cut(self, shape: Shape, frames: Sequence[Any]) -> None:
        """A data message was dealt to a trainer of ``shape``: its rows go into the shape's
        batches (whole bytes: the frames as the sampler encoded them).

        Raises :class:`~feedmux.errors.ProtocolError` when its samples do not stack
        into a batch: none of the message's rows is kept (the caller deals it to the
        others), and the rows held before are :attr:`returned` as sample messages.
        """
        message = decode(list(frames))
        assert isinstance(message, Data)
        tags, samples = message.tags, message.samples
        if not len(tags):
            return
        samples = without_padding(samples)  # a bucketed batch dealt again: its samples
        cut = self._cut(shape)
        first = (int(tags[0, 0]), int(tags[0, 1]))
        if cut.last is not None and cut.last[0] < first[0]:
            self._finish(cut, shape, drop=True)  # an epoch the stream left: its last batch
        elif cut.last is not None and (cut.last[0] > first[0] or (
                cut.assembler.ordered and first <= cut.last)):
            # A lost trainer's rest: an earlier epoch (the one held goes on), or earlier
            # positions than a batch begun in position order.
            self._finish(cut, shape, drop=False)
        try:
            built = cut.assembler.add(tags, samples)
        except ProtocolError:
            # The rows held before go back to the dealer as they came (they may not stack
            # either), none of the message's is kept: the shape starts afresh.
            fresh = self._cuts[shape] = _ShapeCut(shape, self.buckets)
            fresh.pending = cut.pending
            self.returned += [(shape, frames)
                              for frames in self._as_samples(cut.assembler.pieces())]
            raise
        self._pending(cut, built)
        cut.last = (int(tags[-1, 0]), int(tags[-1, 1])) if cut.assembler.held else None

    def finish_epoch(self, epoch: int | None = None) -> None:
        """``epoch`` (None: every one, the stream's end) was dealt whole: each shape's last,
        partial batch of it is made (or dropped, ``drop_last``)."""
        for shape, cut in self._cuts.items():
            if cut.last is not None and (epoch is None or cut.last[0] <= epoch):
                self._finish(cut, shape, drop=True)

    def held_epoch(self) -> int | None:
        """The oldest epoch whose rows a shape holds (None: none held)."""
        epochs = [cut.last[0] for cut in self._cuts.values() if cut.last is not None]
        return min(epochs) if epochs else None

    def pending_of(self, shape: Shape) -> deque[tuple[list[Any], int, int]]:
        """``shape``'s batches built and not sent yet, oldest first (the dealer takes them
        from the front as they go)."""
        return self._cut(shape).pending

    def shapes(self) -> list[Shape]:
        """The shapes with something held or waiting to be sent."""
        return [shape for shape, cut in self._cuts.items() if cut.pending or cut.last]

    def release(self, shape: Shape) -> list[list[Any]]:
        """``shape`` has no trainer left: its batches and rows, as sample messages for the
        others (the batches' frames as they are: any loader takes a batch's rows)."""
        cut = self._cuts.pop(shape, None)
        if cut is None:
            return []
        out = [frames for frames, _, _ in cut.pending]
        if cut.last is not None:
            out += self._as_samples(cut.assembler.pieces())
        return out

    def outstanding(self) -> list[tuple[int, int, int]]:
        """``(epoch, start, end)`` runs of the positions dealt into the shapes and sent to no
        trainer yet: the rows held, the batches built and not sent, the rows given back
        and not dealt again yet (what a summary of the hand-outs lists as not handed out,
        with the ledger's runs). Read every summary interval, not per message."""
        runs = [run for cut in list(self._cuts.values())
                for tags in [*(read_tags(frames) for frames, _, _ in list(cut.pending)),
                             cut.assembler.held_tags()]
                for run in position_runs(tags)]
        return runs + [run for _, frames in list(self.returned)
                       for run in position_runs(read_tags(frames))]

    def owed(self) -> int:
        """Batches built and not sent, and shapes holding rows (the stream's end waits)."""
        return sum(len(cut.pending) + (cut.last is not None) for cut in self._cuts.values())

    # -- inside ------------------------------------------------------------------------------
    def _cut(self, shape: Shape) -> _ShapeCut:
        cut = self._cuts.get(shape)
        if cut is None:
            cut = self._cuts[shape] = _ShapeCut(shape, self.buckets)
            self._bucketed = self._bucketed or bool(shape[2])
        return cut

    def _finish(self, cut: _ShapeCut, shape: Shape, drop: bool) -> None:
        """The rows ``cut`` holds as a short batch (or dropped, ``drop`` and drop_last)."""
        assembler = cut.assembler
        cut.last = None
        pieces = assembler.pieces()
        try:
            if drop:
                before = assembler.dropped
                built = assembler.finish_epoch()
                self.dropped += assembler.dropped - before
            else:
                built = _held(assembler)
        except ProtocolError:  # rows of one message, never stacked: the others take them
            self.returned += [(shape, frames) for frames in self._as_samples(pieces)]
            return
        self._pending(cut, built)

    def _as_samples(self, pieces: list[tuple[Any, Sequence[Any]]]) -> list[list[Any]]:
        return [list(encode(Data(tags, items, self.server_id))) for tags, items in pieces]

    def _pending(self, cut: _ShapeCut, built: list[Batch]) -> None:
        cut.pending.extend(self._encoded(built))

    def _encoded(self, built: list[Batch]) -> list[tuple[list[Any], int, int]]:
        return [(list(encode(Data(batch.tags, batch.items, self.server_id))), len(batch.tags),
                 int(batch.tags[0, 0])) for batch in built]


def _held(assembler: BatchAssembler | BucketAssembler) -> list[Batch]:
    """The rows ``assembler`` holds as one short batch, whatever its ``drop_last``."""
    return assembler.finish_epoch(keep_short=True)

