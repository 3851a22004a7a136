"""One pass of a mux: the sampling loop and the per-mux hooks it calls.

This module owns the per-pass machinery of the muxes: :class:`MuxPass` owns
the loop (draw a slot, take its next item, refill a slot whose stream ended)
and its subclasses override small hooks (``_next_sample_index``,
``_on_stream_exhausted``, ``_replace_stream``). A pass is built afresh for
each activation of a mux, so concurrent passes never share state, and what it
does when a stream raises comes in as an argument, never from ambient state.
It is pure (no I/O, no clocks) and must never call ``rng.choice`` per sample:
slot draws come from blocks of uniforms.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling._pool import make_pool
from feedmux.sampling.streamer import Streamer, StreamErrorHook, activate, close_stream

if TYPE_CHECKING:
    from feedmux.sampling.mux import RoundRobinMux, ShuffledMux, StochasticMux

__all__ = [
    "ChainPass",
    "MuxPass",
    "RoundRobinPass",
    "ShuffledPass",
    "StochasticPass",
    "WeightedPass",
]

T = TypeVar("T")

# The placeholder of a slot with no open stream; the loop never selects one.
_NO_STREAM: Iterator[Any] = iter(())
_END = object()

# Uniforms drawn per block for slot selection: small at first so that short
# passes (nested muxes) stay cheap, growing for long ones.
_FIRST_BLOCK = 64
_MAX_BLOCK = 4096
# pescador switches from the binomial to the poisson cap above this
# probability of drawing the new slot.
_BINOMIAL_LIMIT = 0.9999


class MuxPass(Generic[T]):
    """The state of one activation of a mux; the base class owns the loop.

    ``streams[i]`` is the open stream of slot ``i`` and ``counts[i]`` how many
    items it has yielded since it was opened. Subclasses set up the slots
    and override the hooks.
    """

    def __init__(self, n_slots: int, on_stream_error: StreamErrorHook | None) -> None:
        self.on_stream_error = on_stream_error
        self.streams: list[Iterator[T]] = [_NO_STREAM] * n_slots
        self.counts: list[int] = [0] * n_slots

    def _activate(self, streamer: Streamer[T], limit: int | None = None) -> Iterator[T]:
        """Open one activation of ``streamer``, handing the stream-error hook down."""
        return activate(streamer, limit, self.on_stream_error)

    def _next_sample_index(self) -> int:
        """Return the slot to take the next item from, or -1 to end the pass."""
        raise NotImplementedError

    def _on_stream_exhausted(self, index: int) -> None:
        """Hook: the stream of slot ``index`` ended (``counts[index]`` is its yield)."""

    def _replace_stream(self, index: int) -> None:
        """Hook: open the next stream of slot ``index``, or leave it empty."""
        self.streams[index] = _NO_STREAM

    def _end_stream(self, index: int) -> int:
        """The stream of slot ``index`` ended: refill the slot; return the slot to draw from."""
        produced = self.counts[index]
        self._on_stream_exhausted(index)
        self._replace_stream(index)
        self.counts[index] = 0
        # The draw stands when a stream ended after yielding: the slot's new
        # stream gives the item. pescador draws again, which starves short
        # streams (a ShuffledMux streamer of length 1 lost half its share).
        # After an empty stream the draw is redone, so that every slot gets
        # its turn.
        if not produced or self.streams[index] is _NO_STREAM:
            return self._next_sample_index()
        return index

    def run(self) -> Iterator[T]:
        """Yield the items of the pass."""
        streams = self.streams
        counts = self.counts
        next_index = self._next_sample_index
        on_error = self.on_stream_error
        try:
            index = next_index()
            while index >= 0:
                try:
                    item = next(streams[index])
                except StopIteration:
                    index = self._end_stream(index)
                    continue
                except Exception as error:
                    if on_error is None:
                        raise
                    on_error(error)  # skipping errors: this stream ends, the pass goes on
                    index = self._end_stream(index)
                    continue
                counts[index] += 1
                yield item
                index = next_index()
        finally:
            for stream in streams:
                close_stream(stream)


class WeightedPass(MuxPass[T]):
    """Slots drawn in proportion to their weights, from blocks of uniforms.

    Each draw maps one uniform through the cumulative slot weights (a C-level
    bisect), so the statistics are exactly those of a per-sample weighted
    choice with the current weights, while numpy is called once per block.
    """

    def __init__(
        self, n_slots: int, rng: np.random.Generator, on_stream_error: StreamErrorHook | None
    ) -> None:
        super().__init__(n_slots, on_stream_error)
        self._rng = rng
        self._slot_weights = [0.0] * n_slots
        self._cum = [0.0] * n_slots
        self._total = 0.0
        self._last = 0
        self._uniforms: list[float] = []
        self._n_uniforms = 0
        self._position = 0
        self._block = _FIRST_BLOCK

    def _set_slot_weight(self, index: int, weight: float) -> None:
        if self._slot_weights[index] != weight:
            self._slot_weights[index] = weight
            self._rebuild()

    def _rebuild(self) -> None:
        weights = self._slot_weights
        self._cum = list(accumulate(weights))
        self._total = self._cum[-1]
        last = len(weights) - 1
        while last > 0 and weights[last] <= 0.0:
            last -= 1
        # bisect is bounded by the last live slot: float rounding of
        # u * total up to total then still lands on a live slot.
        self._last = last

    def _next_sample_index(self) -> int:
        total = self._total
        if total <= 0.0:
            return -1
        position = self._position
        if position >= self._n_uniforms:
            self._uniforms = self._rng.random(self._block).tolist()
            self._n_uniforms = self._block
            self._block = min(2 * self._block, _MAX_BLOCK)
            position = 0
        self._position = position + 1
        return bisect_right(self._cum, self._uniforms[position] * total, 0, self._last)


class StochasticPass(WeightedPass[T]):
    def __init__(
        self,
        mux: StochasticMux[T],
        rng: np.random.Generator,
        on_stream_error: StreamErrorHook | None,
    ) -> None:
        n_slots = min(mux.n_active, len(mux.streamers))
        super().__init__(n_slots, rng, on_stream_error)
        self._streamers = mux.streamers
        self._weights: list[float] = mux.weights.tolist()
        self._rate = mux.rate
        self._dist = mux.dist
        self._prune = mux.prune_empty_streams
        self._pool = make_pool(mux.mode, mux.weights, rng)
        self._slot_streamer = [-1] * n_slots
        self._finished_items = 0
        self._empty_mark = -1
        self._empty_streamers: set[int] = set()
        self._stalled = False

        chosen = [self._pool.take() for _ in range(n_slots)]
        for slot, index in enumerate(chosen):
            self._slot_weights[slot] = self._weights[index] if index >= 0 else 0.0
        self._rebuild()
        for slot, index in enumerate(chosen):
            if index >= 0:
                self._open(slot, index)

    def _open(self, slot: int, index: int) -> None:
        self.streams[slot] = self._activate(self._streamers[index], self._cap(slot, index))
        self._slot_streamer[slot] = index

    def _cap(self, slot: int, index: int) -> int | None:
        rate = self._rate
        if rate is None:
            return None
        if self._dist == "constant":
            return math.ceil(rate)
        mean_extra = max(rate - 1.0, 0.0)
        if self._dist == "binomial":
            weight = self._weights[index]
            # The chance that the next draw picks this slot once it holds the
            # new streamer; the binomial keeps the mean at `rate` while the
            # number of replacements stays close to rate * n_active (pescador).
            others = self._total - self._slot_weights[slot]
            chance = weight / (others + weight)
            if chance <= _BINOMIAL_LIMIT:
                trials = int(mean_extra / (1.0 - chance))
                return 1 + int(self._rng.binomial(trials, 1.0 - chance))
        return 1 + int(self._rng.poisson(mean_extra))

    def _on_stream_exhausted(self, slot: int) -> None:
        index = self._slot_streamer[slot]
        produced = self.counts[slot]
        if produced:
            self._finished_items += produced
            self._stalled = False
        elif self._prune:
            self._pool.prune(index)
        else:
            self._note_empty(index)
        self._pool.release(index)

    def _note_empty(self, index: int) -> None:
        # Without pruning, a set of streamers that all come up empty would be
        # re-activated forever (pescador hangs). Once every candidate has come
        # up empty since the last item was yielded, slots are let die.
        emitted = self._finished_items + sum(self.counts)
        if emitted != self._empty_mark:
            self._empty_mark = emitted
            self._empty_streamers.clear()
            self._stalled = False
        self._empty_streamers.add(index)
        if len(self._empty_streamers) >= self._pool.n_candidates:
            self._stalled = True

    def _replace_stream(self, slot: int) -> None:
        index = -1 if self._stalled else self._pool.take()
        if index < 0:
            self.streams[slot] = _NO_STREAM
            self._slot_streamer[slot] = -1
            self._set_slot_weight(slot, 0.0)
            return
        self._open(slot, index)
        self._set_slot_weight(slot, self._weights[index])


class ShuffledPass(WeightedPass[T]):
    def __init__(
        self,
        mux: ShuffledMux[T],
        rng: np.random.Generator,
        on_stream_error: StreamErrorHook | None,
    ) -> None:
        super().__init__(len(mux.streamers), rng, on_stream_error)
        self._streamers = mux.streamers
        self._slot_weights = mux.weights.tolist()
        self._rebuild()
        for index, weight in enumerate(self._slot_weights):
            if weight > 0:
                self.streams[index] = self._activate(self._streamers[index])

    def _on_stream_exhausted(self, index: int) -> None:
        if self.counts[index] == 0:
            self._set_slot_weight(index, 0.0)

    def _replace_stream(self, index: int) -> None:
        if self._slot_weights[index] > 0:
            self.streams[index] = self._activate(self._streamers[index])
        else:
            self.streams[index] = _NO_STREAM


class RoundRobinPass(MuxPass[T]):
    def __init__(
        self,
        mux: RoundRobinMux[T],
        rng: np.random.Generator | None,
        on_stream_error: StreamErrorHook | None,
    ) -> None:
        super().__init__(len(mux.streamers), on_stream_error)
        self._streamers = mux.streamers
        self._mode = mux.mode
        self._rng = rng
        self._alive = [False] * len(mux.streamers)
        self._n_alive = 0
        self._cursor = 0
        self._round_items = 0
        self._start_round()

    def _start_round(self) -> None:
        order: list[int] = (
            self._rng.permutation(len(self._streamers)).tolist()
            if self._rng is not None
            else list(range(len(self._streamers)))
        )
        for slot, index in enumerate(order):
            self.streams[slot] = self._activate(self._streamers[index])
            self._alive[slot] = True
        self._n_alive = len(order)
        self._cursor = 0
        self._round_items = 0

    def _next_sample_index(self) -> int:
        if self._n_alive == 0:
            # A round that yielded nothing would repeat forever: end instead.
            if self._mode == "exhaustive" or self._round_items == 0:
                return -1
            self._start_round()
        alive = self._alive
        n_slots = len(alive)
        slot = self._cursor
        while not alive[slot]:
            slot = slot + 1 if slot + 1 < n_slots else 0
        self._cursor = slot + 1 if slot + 1 < n_slots else 0
        return slot

    def _on_stream_exhausted(self, slot: int) -> None:
        self._alive[slot] = False
        self._n_alive -= 1
        self._round_items += self.counts[slot]


class ChainPass(MuxPass[T]):
    """Each source to its end, one after the other.

    ``open_sources`` gives the sources of one round (the list, or a fresh call
    of the function that yields them); ``cycle`` starts a new round after the last.
    """

    def __init__(
        self,
        open_sources: Callable[[], Iterator[Any]],
        cycle: bool,
        on_stream_error: StreamErrorHook | None,
    ) -> None:
        super().__init__(1, on_stream_error)
        self._open_sources = open_sources
        self._cycle = cycle
        self._sources = open_sources()
        self._round_items = 0
        self._done = False
        self._replace_stream(0)

    def _next_sample_index(self) -> int:
        return -1 if self._done else 0

    def _on_stream_exhausted(self, slot: int) -> None:
        self._round_items += self.counts[slot]

    def _replace_stream(self, slot: int) -> None:
        while True:
            source = next(self._sources, _END)
            if source is not _END:
                self.streams[0] = self._activate_chained(source)
                return
            # A round that yielded nothing would repeat forever: end instead.
            if self._cycle and self._round_items > 0:
                self._sources = self._open_sources()
                self._round_items = 0
                continue
            self.streams[0] = _NO_STREAM
            self._done = True
            return

    def _activate_chained(self, source: object) -> Iterator[Any]:
        if isinstance(source, Streamer):
            return self._activate(source)
        if isinstance(source, Iterable):
            # Items of a generator function are used once per activation, so a
            # one-shot iterable is fine here.
            return iter(source)
        raise SamplingError(
            f"ChainMux's streamers yielded {source!r} ({type(source).__name__}), "
            "which is neither a streamer nor iterable"
        )
