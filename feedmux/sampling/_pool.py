"""Streamer pools of StochasticMux: which streamer fills a slot next, per mode.

This module owns the three activation policies of pescador's StochasticMux
(``with_replacement``, ``single_active``, ``exhaustive``), with feedmux's
fixes: a streamer is drawn in proportion to its weight (so weights steer
activation too), a zero-weight streamer is never drawn, and a pruned
streamer stays pruned in every mode. It draws from the pass's generator only
and keeps no state between passes; it never touches the streamers themselves.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

__all__ = ["ExhaustivePool", "ReplacementPool", "SingleActivePool", "make_pool"]

# Draws from the full weight distribution, rejecting streamers that are not
# available, before falling back to an exact draw over the available ones.
# Rejection keeps the common case O(log n) and is exact: a draw conditioned on
# landing in the available set has the distribution restricted to that set.
_REJECTION_TRIES = 8


class ReplacementPool:
    """Mode ``with_replacement``: a drawn streamer stays available.

    Parameters
    ----------
    weights : numpy.ndarray
        Non-negative weights, one per streamer, at least one positive.
    rng : numpy.random.Generator
        The generator of the pass.
    """

    def __init__(self, weights: np.ndarray, rng: np.random.Generator) -> None:
        self._weights = weights
        self._rng = rng
        self._cum: list[float] = np.cumsum(weights).tolist()
        self._total = self._cum[-1]
        positive = np.flatnonzero(weights > 0)
        self._last = int(positive[-1])
        self._open = (weights > 0).tolist()
        self._pruned = [False] * len(weights)
        self._n_open = len(positive)
        #: Streamers that could still be drawn at some point of the pass.
        self.n_candidates = len(positive)

    def take(self) -> int:
        """Draw the streamer for a slot, or return -1 if none is available."""
        if self._n_open == 0:
            return -1
        cum, total, last, is_open = self._cum, self._total, self._last, self._open
        random = self._rng.random
        for _ in range(_REJECTION_TRIES):
            index = bisect_right(cum, random() * total, 0, last)
            if is_open[index]:
                self._on_taken(index)
                return index
        index = self._exact_draw()
        self._on_taken(index)
        return index

    def _exact_draw(self) -> int:
        candidates = [index for index, available in enumerate(self._open) if available]
        cum = np.cumsum(self._weights[candidates])
        position = int(np.searchsorted(cum, self._rng.random() * cum[-1], side="right"))
        return candidates[min(position, len(candidates) - 1)]

    def _on_taken(self, index: int) -> None:
        """Hook: a streamer was drawn (with replacement: it stays available)."""

    def release(self, index: int) -> None:
        """A streamer's activation ended (with replacement: nothing to do)."""

    def prune(self, index: int) -> None:
        """Never draw this streamer again in this pass."""
        if self._pruned[index]:
            return
        self._pruned[index] = True
        self.n_candidates -= 1
        if self._open[index]:
            self._open[index] = False
            self._n_open -= 1


class SingleActivePool(ReplacementPool):
    """Mode ``single_active``: a streamer is unavailable while it is active."""

    def _on_taken(self, index: int) -> None:
        self._open[index] = False
        self._n_open -= 1

    def release(self, index: int) -> None:
        """Put the streamer back, unless it was pruned."""
        if not self._pruned[index] and not self._open[index]:
            self._open[index] = True
            self._n_open += 1


class ExhaustivePool:
    """Mode ``exhaustive``: every positive-weight streamer once per pass.

    The order of activation is drawn once, at the start of the pass, as a
    weighted permutation: sorting ``Exp(1) / weight`` keys gives each next
    streamer with probability proportional to its weight among those left,
    which is exactly drawing one by one without replacement.
    """

    def __init__(self, weights: np.ndarray, rng: np.random.Generator) -> None:
        positive = np.flatnonzero(weights > 0)
        keys = rng.standard_exponential(len(positive)) / weights[positive]
        self._order: list[int] = positive[np.argsort(keys, kind="stable")].tolist()
        self._position = 0
        self.n_candidates = len(positive)

    def take(self) -> int:
        """The next streamer of the permutation, or -1 once all were taken."""
        position = self._position
        if position >= len(self._order):
            return -1
        self._position = position + 1
        return self._order[position]

    def release(self, index: int) -> None:
        """Nothing to do: a streamer runs once per pass."""

    def prune(self, index: int) -> None:
        """Nothing to do: a streamer runs once per pass."""


def make_pool(
    mode: str, weights: np.ndarray, rng: np.random.Generator
) -> ReplacementPool | ExhaustivePool:
    """Return the pool of ``mode`` for one pass."""
    if mode == "exhaustive":
        return ExhaustivePool(weights, rng)
    if mode == "single_active":
        return SingleActivePool(weights, rng)
    return ReplacementPool(weights, rng)
