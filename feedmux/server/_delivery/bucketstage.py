"""The ranked stage's coordinated steps: samples in, each rank's batch of a step out.

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
(:func:`~feedmux.protocol.padded_batch`). It is pure and must never encode,
send or decide who holds a rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedmux.errors import ConfigurationError
from feedmux.protocol import SampleBatch, padded_batch
from feedmux.server._delivery.batches import Batches, BucketSpec
from feedmux.server._delivery.buckets import BucketWindow, Step
from feedmux.server._delivery.dealing import RankShare

__all__ = ["BucketStage", "sample_length"]


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
    completed, rank by rank. ``start`` (a job resumed at ``(epoch,
    position)``): the source samples that epoch again from its start, and what
    was dealt before ``position`` is left out. ``ahead``: rank -> (epoch,
    position) it stands at, nothing before dealt to it again.

    Examples
    --------
    >>> from feedmux.server._delivery.batches import Batches, BucketSpec
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
                                   uneven, spec.seed)
        self.start = start
        self.ahead: dict[int, tuple[int, int]] = dict(ahead or {})

    def deal(self, epoch: int, rows: Sequence[Any]) -> list[RankShare]:
        """The shares of the steps that ``rows`` (the next of ``epoch``) complete."""
        if type(rows) is SampleBatch:
            rows = rows.unstacked()
        key = self.key
        lengths = [sample_length(row, key) for row in rows]
        steps = self.window.add(epoch, lengths, list(zip(rows, lengths, strict=True)))
        return self._shares(steps, last=False)

    def finish_epoch(self, epoch: int) -> list[RankShare]:
        """``epoch`` has no more rows: the rest of the window, its last batches evened."""
        return self._shares(self.window.finish_epoch(epoch), last=True)

    def _shares(self, steps: list[Step], last: bool) -> list[RankShare]:
        shares = []
        size, drop_last = self.batches.batch_size, self.batches.drop_last
        for step in steps:
            for rank, rows in enumerate(step.ranks):
                positions = step.positions(rank)
                if last and drop_last and len(rows) < size:
                    self.batches.bucket_dropped += len(rows)
                    continue
                had = self._had(step.epoch, rank, positions)
                if had < len(rows):
                    rows, positions = rows[had:], positions[had:]
                    tags = np.empty((len(rows), 2), dtype=np.int64)
                    tags[:, 0], tags[:, 1] = step.epoch, positions
                    batch = padded_batch([row for row, _ in rows], [n for _, n in rows])
                    shares.append(RankShare(rank, tags, batch))
        return shares

    def _had(self, epoch: int, rank: int, positions: np.ndarray) -> int:
        """How many of a rank's rows at ``positions`` (ascending) it had: those before the
        resume position, or before where a rank that is ahead stands."""
        cut = 0
        for where in (self.start, self.ahead.get(rank)):
            if where is not None and epoch == where[0]:
                cut = max(cut, int(np.searchsorted(positions, where[1])))
            elif where is not None and epoch < where[0]:
                cut = len(positions)
        return cut
