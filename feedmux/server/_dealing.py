"""The ranked dealing rule: which rank of a data-parallel job gets which sample of an epoch.

This module owns the rule and nothing else. Position ``p`` of an epoch goes to
rank ``p % n`` (the order of torch's ``DistributedSampler``, ``indices[r::n]``),
and every rank gets the same number of samples per epoch: with ``"pad"`` the
last, partial round is completed with repeats of the epoch's first samples
(padded positions ``E .. n*ceil(E/n) - 1`` carry the samples of positions
``0, 1, ...``), so every rank gets ``ceil(E / n)``; with ``"drop"`` the partial
round is not delivered and every rank gets ``E // n``. It is pure: lists in,
lists out, no sockets, no clock, no encoding — the producer encodes what it
returns and the shell sends it. It must never decide anything about trainers
(who holds a rank is the control core's business).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from feedmux.errors import ConfigurationError

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
    """Samples for one rank: ``tags`` (int64, rows of (epoch, position)) and ``items``."""

    rank: int
    tags: np.ndarray
    items: list[Any]


class RankDealer:
    """Deals the chunks of each epoch to ``world_size`` ranks, a whole round at a time.

    Feed it the items of an epoch in position order (:meth:`deal`, any chunk
    sizes), then call :meth:`finish_epoch`. It hands out complete rounds only
    (``n`` consecutive positions, one per rank) and keeps the rest — fewer than
    ``n`` items — for the next chunk, so a message never needs splitting after
    it is encoded; with ``"pad"`` it also keeps the epoch's first ``n - 1``
    items, to repeat them. Per-rank slices are C-level list slices
    (``block[r::n]``), not per-item Python work.

    Examples
    --------
    >>> dealer = RankDealer(2, "pad")
    >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.deal(1, ["a", "b", "c"])]
    [(0, [0], ['a']), (1, [1], ['b'])]
    >>> [(s.rank, s.tags[:, 1].tolist(), s.items) for s in dealer.finish_epoch(1)]
    [(0, [2], ['c']), (1, [3], ['a'])]
    """

    def __init__(self, world_size: int, uneven: str = "pad") -> None:
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ConfigurationError(f"expected world_size an int >= 1, got {world_size!r}")
        if uneven not in UNEVEN_MODES:
            raise ConfigurationError(f"expected uneven 'pad' or 'drop', got {uneven!r}")
        self.world_size = world_size
        self.uneven = uneven
        self._epoch = 0
        self._next = 0  # the position of the first item of _carry
        self._carry: list[Any] = []
        self._first: list[Any] = []

    def deal(self, epoch: int, items: Sequence[Any]) -> list[RankShare]:
        """The complete rounds that ``items`` (the next items of ``epoch``) finish."""
        if epoch != self._epoch:
            if self._carry:
                raise ValueError(
                    f"expected finish_epoch({self._epoch}) before items of epoch {epoch}"
                )
            self._epoch, self._next, self._first = epoch, 0, []
        n = self.world_size
        if self.uneven == "pad" and len(self._first) < n - 1:
            self._first.extend(items[: n - 1 - len(self._first)])
        block = self._carry + list(items) if self._carry else list(items)
        whole = len(block) - len(block) % n
        self._carry = block[whole:]
        start = self._next
        self._next += whole
        if not whole:
            return []
        return self._shares(epoch, start, block[:whole] if self._carry else block)

    def finish_epoch(self, epoch: int) -> list[RankShare]:
        """The epoch has no more items: pad or drop its last, partial round."""
        carry, self._carry = self._carry, []
        if not carry or epoch != self._epoch:
            return []
        if self.uneven == "drop":
            return []
        n = self.world_size
        first = self._first or carry
        # A tiny epoch (fewer samples than ranks) repeats its samples as often as needed.
        padding = [first[i % len(first)] for i in range(n - len(carry))]
        return self._shares(epoch, self._next, carry + padding)

    def _shares(self, epoch: int, start: int, block: list[Any]) -> list[RankShare]:
        n = self.world_size
        steps = len(block) // n
        shares = []
        for rank in range(n):
            tags = np.empty((steps, 2), dtype=np.int64)
            tags[:, 0] = epoch
            tags[:, 1] = np.arange(start + rank, start + rank + n * steps, n)
            shares.append(RankShare(rank, tags, block[rank::n]))
        return shares
