"""The ranked dealing stage: an epoch's rows in, one encoded data message per rank out.

Every source of a ranked job goes through :class:`RankedStage`: the
in-process producer (the items it draws), the forwarder of ``--workers N``
(the rows of the workers' decoded messages, several held and dealt together)
and a ranked consumer group (the rows of its buffered messages). The stage
owns what comes around the pure rule of :class:`~.dealing.RankDealer`: the
resume cut of a job restarted from a checkpoint (the resumed epoch's rows
before the position dropped, its first rows kept for the padding), the end of
an epoch (pad or drop), the server-built batches per rank (:mod:`.batches`),
the ranks that are ahead, and the encoding of each rank's share into one data
message. When the ranks asked for ``bucket_by=`` (``batches.buckets``) a
:class:`~.bucketstage.BucketStage` deals instead of the round-by-round rule,
whole steps by length, with the same calls. It is pure: rows in, frames out,
no sockets, no clock; the callers send what it returns, in order, each message
to its rank. It must never decide who holds a rank nor send anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.protocol import RESUME_CHECKPOINT as CHECKPOINT
from feedmux.protocol import Data, encode, take_samples
from feedmux.server._delivery.batches import Batches
from feedmux.server._delivery.bucketstage import BucketStage
from feedmux.server._delivery.dealing import RankDealer, RankShare

__all__ = ["RANK_REFUSED", "RankMessage", "RankedStage", "ResumeCut", "batched_shares",
           "describe", "not_whole"]

#: The error type of a refused rank (a duplicate, a job's disagreement, a resume that
#: this server cannot serve).
RANK_REFUSED = "feedmux.errors.ConfigurationError"


class RankMessage(NamedTuple):
    """One encoded data message for ``rank``: its ``frames``, the ``samples`` it holds and
    the ``epoch`` they belong to."""

    frames: list[Any]
    samples: int
    epoch: int
    rank: int


class ResumeCut:
    """Drops the samples of the resumed epoch before the resume position, as they are merged.

    With several sampling workers each worker skips whole epochs only (its shard's
    positions within the merged epoch are known only when merged), so the server
    cuts the merged stream of epoch ``epoch`` at ``position`` and keeps its first
    ``keep`` samples (the ranked dealer pads with them).

    Examples
    --------
    >>> import numpy as np
    >>> cut = ResumeCut(2, 5, keep=2)
    >>> cut.cut(np.arange(0, 3), ["a", "b", "c"]), cut.done
    ([], False)
    >>> cut.cut(np.arange(3, 7), ["d", "e", "f", "g"]), cut.done, cut.head
    (['f', 'g'], True, ['a', 'b'])
    """

    def __init__(self, epoch: int, position: int, keep: int) -> None:
        self.epoch = epoch
        self.position = position
        self.keep = keep
        self.head: list[Any] = []
        #: Whether the cut is behind: every later sample goes on.
        self.done = False

    def cut(self, positions: np.ndarray, samples: Sequence[Any]) -> Sequence[Any]:
        """The samples (at ``positions``, ascending) of the resumed epoch that go on."""
        if self.done:
            return samples
        lead = int(np.searchsorted(positions, self.position))
        self.head.extend(samples[:max(0, min(lead, self.keep - len(self.head)))])
        rest = take_samples([(samples, slice(lead, None))])  # a batch stays a batch
        self.done = bool(rest)
        return rest


class RankedStage:
    """Deals the rows of each epoch to the ranks of ``dealer`` and encodes every rank's share.

    Feed it the rows of an epoch in position order — :meth:`deal` (now) or
    :meth:`hold` (kept until about ``world_size`` messages' worth are there, so
    that each rank's message is as full as one of those fed; :meth:`flush`
    deals them sooner) — then call :meth:`finish_epoch`. Each call returns the
    messages its rows completed, in the order they go out, encoded as they are
    iterated (iterate them all: what was dealt is gone from the stage).

    With ``batches`` (the trainers asked for ``batch_size=``) each rank's share
    is cut into training batches, one message per run of whole batches. With
    ``start`` (a job resumed at ``(epoch, position)``) the rows of that epoch
    before ``position`` are dropped and its first ones kept for the padding; a
    source that skipped them itself tells the stage their head with
    :meth:`skipped`.

    Examples
    --------
    >>> from feedmux.protocol import decode
    >>> stage = RankedStage(RankDealer(2, "pad"), "srv", start=(3, 2))
    >>> stage.skipped(3, ["a", "b"])
    >>> [(m.rank, decode(m.frames).samples) for m in stage.deal(3, 2, ["c", "d", "e"])]
    [(0, ['c']), (1, ['d'])]
    >>> [(m.rank, m.epoch, decode(m.frames).tags.tolist()) for m in stage.finish_epoch(3)]
    [(0, 3, [[3, 4]]), (1, 3, [[3, 5]])]
    """

    def __init__(self, dealer: RankDealer, server_id: str, *, batches: Batches | None = None,
                 start: tuple[int, int] | None = None) -> None:
        self.dealer = dealer
        self.server_id = server_id
        self.batches = batches
        # The resumed epoch's rows before its position are dropped; the first world_size - 1
        # are kept, as the padding repeats them.
        self._cut = None if start is None else ResumeCut(*start, dealer.world_size - 1)
        self._held: list[Sequence[Any]] = []  # rows of epoch _held_epoch not dealt yet
        self._held_epoch = 0
        #: The coordinated steps (bucket_by=), or None: the round-by-round rule deals.
        self.buckets = None if batches is None or batches.buckets is None else BucketStage(
            dealer.world_size, dealer.uneven, batches, start, dealer.ahead)

    @property
    def resamples_resumed_epoch(self) -> bool:
        """Whether a resumed epoch must be sampled again from its start (the steps dealt by
        length depend on all of its rows): the source then skips only the epochs before."""
        return self.buckets is not None

    @property
    def world_size(self) -> int:
        return self.dealer.world_size

    def skipped(self, epoch: int, head: Sequence[Any]) -> None:
        """The source skipped the rows of the resumed ``epoch`` before its position itself;
        ``head`` is its first rows, as many as the padding may repeat (``world_size - 1``,
        or all of them when the position comes before)."""
        if self._cut is not None and epoch == self._cut.epoch and self.buckets is None:
            self._cut.cut(np.arange(len(head)), head)

    def deal(self, epoch: int, position: int, rows: Sequence[Any]) -> Iterator[RankMessage]:
        """Deal ``rows`` (of ``epoch``, the first at ``position``) and any held before."""
        if self.buckets is not None:
            return self._encoded(self.buckets.deal(epoch, rows))
        shares = self._take(epoch, position, rows)
        return self._encoded(shares + self._held_shares())

    def hold(self, epoch: int, position: int, rows: Sequence[Any]) -> Iterator[RankMessage]:
        """Keep ``rows`` (of ``epoch``, the first at ``position``) to deal with the next ones,
        until about ``world_size`` times as many as the largest of them are held (by
        length: the window holds them)."""
        if self.buckets is not None:
            return self.deal(epoch, position, rows)
        shares = self._take(epoch, position, rows)
        held = self._held
        if held and sum(map(len, held)) >= self.world_size * max(map(len, held)):
            shares += self._held_shares()
        return self._encoded(shares)

    @property
    def holding(self) -> bool:
        """Whether rows are held, not dealt yet."""
        return bool(self._held)

    def flush(self) -> Iterator[RankMessage]:
        """Deal the rows held (no more are coming soon)."""
        return self._encoded(self._held_shares())

    def finish_epoch(self, epoch: int) -> Iterator[RankMessage]:
        """``epoch`` has no more rows: deal what is held, pad or drop its last round, and
        send each rank's last, partial batch (or drop it, ``drop_last``)."""
        if self.buckets is not None:
            return self._encoded(self.buckets.finish_epoch(epoch))
        shares = self._held_shares()
        shares += self._batched(self.dealer.finish_epoch(epoch), last=True)
        return self._encoded(shares)

    def _take(self, epoch: int, position: int, rows: Sequence[Any]) -> list[RankShare]:
        """Hold ``rows`` but those before the resume position; returns the shares of rows
        held of another epoch (an epoch's rows are never dealt with another's)."""
        shares = self._held_shares() if epoch != self._held_epoch else []
        cut = self._cut
        if cut is not None and epoch == cut.epoch and not cut.done and len(rows):
            rows = cut.cut(np.arange(position, position + len(rows)), rows)
            if len(rows):  # the first rows at or after the position: dealt from there on
                self.dealer.resume(epoch, cut.position, cut.head)
        if len(rows):
            self._held.append(rows)
            self._held_epoch = epoch
        return shares

    def _held_shares(self) -> list[RankShare]:
        """The shares of the rows held, dealt now."""
        if not self._held:
            return []
        held, self._held = self._held, []
        return self._batched(self.dealer.deal(self._held_epoch, *held), last=False)

    def _batched(self, shares: list[RankShare], last: bool) -> list[RankShare]:
        return shares if self.batches is None else batched_shares(self.batches, shares, last)

    def _encoded(self, shares: list[RankShare]) -> Iterator[RankMessage]:
        for share in shares:
            if len(share.items):
                frames = encode(Data(share.tags, share.items, self.server_id))
                yield RankMessage(frames, len(share.items), int(share.tags[0, 0]), share.rank)


def batched_shares(batches: Batches, shares: list[RankShare], last: bool) -> list[RankShare]:
    """The ranks' shares cut into training batches, one share per run of whole batches
    (``last``: the epoch ended with these shares, its last partial batches too)."""
    out = [RankShare(share.rank, batch.tags, batch.items) for share in shares if share.items
           for batch in batches.of(share.rank).add(share.tags, share.items)]
    if last:
        out += [RankShare(rank, batch.tags, batch.items)
                for rank, batch in batches.finish_epoch()]
    return out


def describe(resume: Sequence[int]) -> str:
    """A resume announcement in words, for logs and errors.

    Examples
    --------
    >>> describe((2, 40, 4, CHECKPOINT))
    'a checkpoint at epoch 2, position 40 (taken with 4 ranks)'
    >>> from feedmux.protocol import RESUME_LIVE
    >>> describe((2, 40, 4, RESUME_LIVE)), describe(())
    ('epoch 2, position 40 (live, 4 ranks)', 'no position (a fresh start)')
    """
    if not resume:
        return "no position (a fresh start)"
    epoch, position, world_size, kind = resume
    if kind == CHECKPOINT:
        return f"a checkpoint at epoch {epoch}, position {position} (taken with {world_size} ranks)"
    return f"epoch {epoch}, position {position} (live, {world_size} ranks)"


def not_whole(group: str, resume: Sequence[int], oldest: int) -> str:
    """Why ranked group ``group`` cannot resume at ``resume`` (a checkpoint's
    announcement) on this server, whose stream gives epochs whole from ``oldest`` on.

    Examples
    --------
    >>> not_whole("lm", (2, 128, 2, CHECKPOINT), 4)[84:170]
    "and this server's stream can no longer give epoch 2 whole: the consumer groups' buffer"
    """
    return (f"group {group!r} resumes from {describe(resume)}, and this server's stream can "
            f"no longer give epoch {resume[0]} whole: the consumer groups' buffer has "
            f"dropped its first messages and the sampler is past it (the oldest epoch it can "
            f"give whole is {oldest}); resume the job on a server of its own (no group=), "
            f"started with the same --seed")
