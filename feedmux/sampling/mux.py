"""Muxes: streamers that interleave other streamers (pescador 3.0's four, fixed).

This module owns :class:`StochasticMux`, :class:`ShuffledMux`,
:class:`RoundRobinMux` and :class:`ChainMux`. Each activation of a mux is one
*pass*, run by a per-pass object (so concurrent passes never share state)
whose base class owns the sampling loop and whose subclasses override small
hooks: ``_next_sample_index``, ``_on_stream_exhausted`` and
``_replace_stream``. It is pure (no I/O, no clocks) and must never call
``rng.choice`` per sample: slot draws come from blocks of uniforms.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from itertools import accumulate
from typing import Any, Generic, TypeVar

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling._pool import make_pool
from feedmux.sampling._rng import SeedPlan, seed_plan
from feedmux.sampling.streamer import Streamer, _close, is_integer, is_real

__all__ = ["BaseMux", "ChainMux", "RoundRobinMux", "ShuffledMux", "StochasticMux"]

T = TypeVar("T")

STOCHASTIC_MODES = ("with_replacement", "single_active", "exhaustive")
DISTRIBUTIONS = ("constant", "binomial", "poisson")
ROUND_ROBIN_MODES = ("exhaustive", "cycle", "permuted_cycle")
CHAIN_MODES = ("exhaustive", "cycle")

#: What a mux does when one of its streams raises. None (the default): the
#: exception propagates and ends the pass. A callable (set by a server running
#: with ``on_error="skip"``): it is called with the exception, then the stream
#: counts as ended and the pass goes on with the others.
on_stream_error: ContextVar[Callable[[BaseException], None] | None] = ContextVar(
    "on_stream_error", default=None
)

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


# --- argument checks -------------------------------------------------------------


def _check_choice(value: object, argument: str, choices: Sequence[str]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise SamplingError(f"{argument} must be one of {allowed}, got {argument}={value!r}")


def _as_streamer(item: object, argument: str) -> Streamer[Any]:
    if isinstance(item, Streamer):
        return item
    try:
        return Streamer(item)
    except SamplingError as error:
        raise SamplingError(f"invalid element of {argument}: {error}") from None


def _check_streamers(streamers: object, argument: str = "streamers") -> list[Streamer[Any]]:
    if isinstance(streamers, Iterator):
        raise SamplingError(
            f"{argument} must be a list of streamers or re-iterables, got "
            f"{argument}={streamers!r}, which is a one-shot iterator; pass a list (ChainMux "
            "also takes the function that yields the streamers, called at each activation)"
        )
    if not isinstance(streamers, Iterable):
        raise SamplingError(
            f"{argument} must be a list of streamers or re-iterables, got "
            f"{argument}={streamers!r}, which is not iterable"
        )
    checked = [_as_streamer(item, argument) for item in streamers]
    if not checked:
        raise SamplingError(f"{argument} must not be empty, got {argument}={streamers!r}")
    return checked


def _check_weights(weights: object, n_streams: int) -> np.ndarray:
    if weights is None:
        return np.full(n_streams, 1.0 / n_streams)
    try:
        array = np.atleast_1d(np.asarray(weights, dtype=np.float64))
    except (TypeError, ValueError):
        raise SamplingError(
            f"weights must be a sequence of {n_streams} numbers >= 0, got weights={weights!r}"
        ) from None
    if array.ndim != 1 or len(array) != n_streams:
        raise SamplingError(
            f"weights must have one weight per streamer ({n_streams}), got "
            f"{array.size} in weights={weights!r}"
        )
    if not np.isfinite(array).all():
        raise SamplingError(f"weights must be finite, got weights={weights!r}")
    if (array < 0).any():
        index = int(np.flatnonzero(array < 0)[0])
        raise SamplingError(
            f"weights must be >= 0, got weights[{index}]={float(array[index])!r} in "
            f"weights={weights!r}"
        )
    if not (array > 0).any():
        raise SamplingError(
            f"weights must contain at least one positive value, got weights={weights!r}"
        )
    normalized: np.ndarray = array / array.sum()
    return normalized


def _check_positive_int(value: object, argument: str) -> int:
    if is_integer(value) and int(value) >= 1:
        return int(value)
    raise SamplingError(f"{argument} must be an int >= 1, got {argument}={value!r}")


def _check_rate(rate: object) -> float | None:
    if rate is None:
        return None
    if is_real(rate):
        value = float(rate)
        if value > 0 and math.isfinite(value):
            return value
    raise SamplingError(f"rate must be None or a finite number > 0, got rate={rate!r}")


def _check_shard(index: object, count: object) -> None:
    if not (is_integer(count) and int(count) >= 1):
        raise SamplingError(f"count must be an int >= 1, got count={count!r}")
    if not (is_integer(index)):
        raise SamplingError(f"index must be an int, got index={index!r}")
    if not 0 <= int(index) < int(count):
        raise SamplingError(f"index must be in [0, {count}), got index={index!r}")


# --- one pass of a mux: the template ------------------------------------------------


class _MuxPass(Generic[T]):
    """The state of one activation of a mux; the base class owns the loop.

    ``streams[i]`` is the open stream of slot ``i`` and ``counts[i]`` how many
    items it has yielded since it was opened. Subclasses set up the slots
    and override the hooks.
    """

    def __init__(self, n_slots: int) -> None:
        self.streams: list[Iterator[T]] = [_NO_STREAM] * n_slots
        self.counts: list[int] = [0] * n_slots

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
        on_error = on_stream_error.get()
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
                _close(stream)


class _WeightedPass(_MuxPass[T]):
    """Slots drawn in proportion to their weights, from blocks of uniforms.

    Each draw maps one uniform through the cumulative slot weights (a C-level
    bisect), so the statistics are exactly those of a per-sample weighted
    choice with the current weights, while numpy is called once per block.
    """

    def __init__(self, n_slots: int, rng: np.random.Generator) -> None:
        super().__init__(n_slots)
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


class _StochasticPass(_WeightedPass[T]):
    def __init__(self, mux: StochasticMux[T], rng: np.random.Generator) -> None:
        n_slots = min(mux.n_active, len(mux.streamers))
        super().__init__(n_slots, rng)
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
        self.streams[slot] = self._streamers[index].iterate(self._cap(slot, index))
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


class _ShuffledPass(_WeightedPass[T]):
    def __init__(self, mux: ShuffledMux[T], rng: np.random.Generator) -> None:
        super().__init__(len(mux.streamers), rng)
        self._streamers = mux.streamers
        self._slot_weights = mux.weights.tolist()
        self._rebuild()
        for index, weight in enumerate(self._slot_weights):
            if weight > 0:
                self.streams[index] = self._streamers[index].iterate()

    def _on_stream_exhausted(self, index: int) -> None:
        if self.counts[index] == 0:
            self._set_slot_weight(index, 0.0)

    def _replace_stream(self, index: int) -> None:
        if self._slot_weights[index] > 0:
            self.streams[index] = self._streamers[index].iterate()
        else:
            self.streams[index] = _NO_STREAM


class _RoundRobinPass(_MuxPass[T]):
    def __init__(self, mux: RoundRobinMux[T], rng: np.random.Generator | None) -> None:
        super().__init__(len(mux.streamers))
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
            self.streams[slot] = self._streamers[index].iterate()
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


class _ChainPass(_MuxPass[T]):
    def __init__(self, mux: ChainMux[T]) -> None:
        super().__init__(1)
        self._mux = mux
        self._cycle = mux.mode == "cycle"
        self._sources = mux._open_sources()
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
                self.streams[0] = _activate_chained(source)
                return
            # A round that yielded nothing would repeat forever: end instead.
            if self._cycle and self._round_items > 0:
                self._sources = self._mux._open_sources()
                self._round_items = 0
                continue
            self.streams[0] = _NO_STREAM
            self._done = True
            return


def _activate_chained(source: object) -> Iterator[Any]:
    if isinstance(source, Streamer):
        return source.iterate()
    if isinstance(source, Iterable):
        # Items of a generator function are used once per activation, so a
        # one-shot iterable is fine here.
        return iter(source)
    raise SamplingError(
        f"ChainMux's streamers yielded {source!r} ({type(source).__name__}), "
        "which is neither a streamer nor iterable"
    )


# --- the muxes -----------------------------------------------------------------------


class BaseMux(Streamer[T]):
    """The common part of every mux: a streamer over other streamers.

    Each activation (``iterate()``, ``cycle()``, ...) is one pass, run by a
    fresh per-pass object built by :meth:`_make_pass`; the random generator of
    pass ``p`` is derived from (seed, p), so every pass has its own order and
    a seeded mux replays the same sequence of passes run after run.

    Parameters
    ----------
    streamers : list of Streamer or re-iterable
        The streamers to interleave; re-iterables are wrapped in a Streamer.
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed. ``None`` draws from numpy's global random state at each
        pass; a Generator or RandomState is drawn from once, at construction.

    Examples
    --------
    Every mux is a streamer, so muxes nest:

    >>> inner = RoundRobinMux(["ab", "cd"])
    >>> isinstance(inner, BaseMux), isinstance(inner, Streamer)
    (True, True)
    >>> "".join(ChainMux([inner, "xy"])(max_iter=10, cycle=True))
    'acbdxyacbd'
    """

    streamers: list[Streamer[T]]

    def __init__(self, streamers: list[Streamer[T]], random_state: object = None) -> None:
        # A mux does not wrap one source: the streamers are its source, and
        # _start (the activation hook) runs a pass over them.
        self.streamers = streamers
        self.source = streamers
        self.args = ()
        self.kwargs = {}
        self._callable_source = False
        self._active = 0
        self._factory = None
        self._seed_plan: SeedPlan = seed_plan(random_state)
        self._passes = 0

    @property
    def n_streams(self) -> int:
        """The number of streamers."""
        return len(self.streamers)

    def _start(self) -> Iterator[T]:
        self._passes += 1
        return self._make_pass(self._passes).run()

    def _pass_rng(self, pass_number: int) -> np.random.Generator:
        return self._seed_plan.for_pass(pass_number)

    def _make_pass(self, pass_number: int) -> _MuxPass[T]:
        """Build the state of pass ``pass_number`` (1-based)."""
        raise NotImplementedError

    def _shard(self, index: int, count: int) -> Streamer[T] | None:
        """The mux over ``streamers[index::count]``, or None if it cannot split so."""
        return None

    def _shard_streamers(self, index: int, count: int) -> list[Streamer[T]]:
        part = self.streamers[index::count]
        if not part:
            raise SamplingError(
                f"shard {index} of {count} of {self!r} has no streamers: the mux has only "
                f"{len(self.streamers)}; use at most {len(self.streamers)} workers"
            )
        return part

    def _with_shard_seed(self, shard: BaseMux[T], index: int) -> BaseMux[T]:
        shard._seed_plan = self._seed_plan.child(index)
        return shard

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<{len(self.streamers)} streamers>{self._repr_arguments()})"

    def _repr_arguments(self) -> str:
        return ""


def _shard_weights(mux: object, weights: np.ndarray, index: int, count: int) -> np.ndarray:
    """The weights of shard ``index`` of ``count``; refuses a shard that could yield nothing."""
    part = weights[index::count]
    if not (part > 0).any():
        raise SamplingError(
            f"shard {index} of {count} of {mux!r} has only zero-weight streamers; "
            "use fewer workers or reorder the streamers"
        )
    return part


class StochasticMux(BaseMux[T]):
    """Interleave a few active streamers at random, replacing them as they end.

    ``n_active`` slots each hold an activation of a streamer drawn in
    proportion to its weight; every item comes from a slot drawn in
    proportion to the weights of the slots. An activation ends when its
    streamer ends or after a number of items drawn from ``dist`` with mean
    ``rate``; the slot is then refilled from the pool of ``mode``.

    Parameters
    ----------
    streamers : iterable of Streamer or re-iterable
        The streamers to sample from.
    n_active : int >= 1
        The number of slots. More than the number of streamers is clamped
        to it (pescador 3.0 raises outside ``with_replacement``).
    rate : float > 0 or None
        Mean number of items per activation; None runs each activation to the
        end of its streamer.
    weights : sequence of float >= 0, optional
        Relative weight of each streamer (uniform if None). Integer weights
        are fine. A zero-weight streamer is never activated.
    mode : {"with_replacement", "single_active", "exhaustive"}
        ``with_replacement``: any streamer can fill any slot, even several at
        once; a pass never ends unless every streamer is pruned.
        ``single_active``: a streamer fills at most one slot at a time.
        ``exhaustive``: each streamer is activated once per pass; with
        ``rate=None`` one pass yields every item exactly once (an epoch).
    prune_empty_streams : bool
        Drop, for the rest of the pass, a streamer whose activation yielded
        nothing (in every mode, ``single_active`` included). Without pruning,
        once every streamer has come up empty with no item yielded since, the
        slots are let die and the pass ends (pescador loops forever).
    dist : {"binomial", "constant", "poisson"}
        The distribution of the number of items per activation when ``rate``
        is set: ``constant`` gives ``rate``; ``poisson`` ``1 + Poisson(rate - 1)``;
        ``binomial`` ``1 + Binomial(n, 1 - p)`` with ``p`` the chance of the
        new slot being drawn and ``n = (rate - 1) / (1 - p)``, as in pescador.
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed; each pass draws a different, reproducible order.

    Raises
    ------
    SamplingError
        On an empty ``streamers``, an unknown ``mode`` or ``dist``, a bad
        ``n_active``, ``rate``, ``weights`` or ``random_state``.

    Examples
    --------
    >>> mux = StochasticMux(["ab", "cd", "ef"], n_active=2, rate=None,
    ...                     mode="exhaustive", random_state=0)
    >>> epoch_1, epoch_2 = "".join(mux), "".join(mux)
    >>> sorted(epoch_1), sorted(epoch_2)
    (['a', 'b', 'c', 'd', 'e', 'f'], ['a', 'b', 'c', 'd', 'e', 'f'])
    >>> len(list(StochasticMux(["a", "b"], 1, rate=2)(max_iter=10)))
    10
    """

    def __init__(
        self,
        streamers: Iterable[Streamer[T] | Iterable[T]],
        n_active: int,
        rate: float | None,
        weights: Sequence[float] | np.ndarray | None = None,
        mode: str = "with_replacement",
        prune_empty_streams: bool = True,
        dist: str = "binomial",
        random_state: object = None,
    ) -> None:
        checked = _check_streamers(streamers)
        self.n_active = _check_positive_int(n_active, "n_active")
        self.rate = _check_rate(rate)
        self.mode = _check_choice(mode, "mode", STOCHASTIC_MODES)
        self.dist = _check_choice(dist, "dist", DISTRIBUTIONS)
        self.prune_empty_streams = bool(prune_empty_streams)
        self.weights = _check_weights(weights, len(checked))
        super().__init__(checked, random_state)

    def _make_pass(self, pass_number: int) -> _MuxPass[T]:
        return _StochasticPass(self, self._pass_rng(pass_number))

    def _shard(self, index: int, count: int) -> Streamer[T]:
        part = self._shard_streamers(index, count)
        weights = _shard_weights(self, self.weights, index, count)
        shard = StochasticMux(
            part,
            self.n_active,
            self.rate,
            weights=weights,
            mode=self.mode,
            prune_empty_streams=self.prune_empty_streams,
            dist=self.dist,
        )
        return self._with_shard_seed(shard, index)

    def _repr_arguments(self) -> str:
        return (
            f", n_active={self.n_active}, rate={self.rate}, mode={self.mode!r}, dist={self.dist!r}"
        )


class ShuffledMux(BaseMux[T]):
    """Interleave all streamers at random, restarting each one as it ends.

    Every streamer is always active; each item comes from a streamer drawn
    in proportion to its weight. A streamer whose activation yields nothing is
    dropped; the pass ends when every streamer has been dropped, so with any
    non-empty streamer it is infinite.

    Parameters
    ----------
    streamers : iterable of Streamer or re-iterable
        The streamers to sample from.
    weights : sequence of float >= 0, optional
        Relative weight of each streamer (uniform if None).
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed; each pass draws a different, reproducible order.

    Examples
    --------
    >>> mux = ShuffledMux(["a", "b"], weights=[4, 1], random_state=1)
    >>> sample = "".join(mux(max_iter=4000))
    >>> round(sample.count("a") / len(sample), 1)
    0.8
    """

    def __init__(
        self,
        streamers: Iterable[Streamer[T] | Iterable[T]],
        weights: Sequence[float] | np.ndarray | None = None,
        random_state: object = None,
    ) -> None:
        checked = _check_streamers(streamers)
        self.weights = _check_weights(weights, len(checked))
        super().__init__(checked, random_state)

    def _make_pass(self, pass_number: int) -> _MuxPass[T]:
        return _ShuffledPass(self, self._pass_rng(pass_number))

    def _shard(self, index: int, count: int) -> Streamer[T]:
        part = self._shard_streamers(index, count)
        weights = _shard_weights(self, self.weights, index, count)
        return self._with_shard_seed(ShuffledMux(part, weights=weights), index)


class RoundRobinMux(BaseMux[T]):
    """Take one item from each streamer in turn, skipping those that ended.

    Parameters
    ----------
    streamers : iterable of Streamer or re-iterable
        The streamers to interleave.
    mode : {"exhaustive", "cycle", "permuted_cycle"}
        ``exhaustive``: the pass ends when every streamer has ended.
        ``cycle``: then every streamer restarts, forever.
        ``permuted_cycle``: the same, with the streamers in a new random order
        in each round, the first one included (pescador keeps the first round
        in order). A round that yields nothing ends the pass instead of
        looping forever.
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        The seed of ``permuted_cycle``.

    Examples
    --------
    >>> "".join(RoundRobinMux(["ab", "cde", "fghi"]))
    'acfbdgehi'
    >>> "".join(RoundRobinMux(["ab", "c"], mode="cycle")(max_iter=7))
    'acbacba'
    """

    def __init__(
        self,
        streamers: Iterable[Streamer[T] | Iterable[T]],
        mode: str = "exhaustive",
        random_state: object = None,
    ) -> None:
        checked = _check_streamers(streamers)
        self.mode = _check_choice(mode, "mode", ROUND_ROBIN_MODES)
        super().__init__(checked, random_state)

    def _make_pass(self, pass_number: int) -> _MuxPass[T]:
        rng = self._pass_rng(pass_number) if self.mode == "permuted_cycle" else None
        return _RoundRobinPass(self, rng)

    def _shard(self, index: int, count: int) -> Streamer[T]:
        part = self._shard_streamers(index, count)
        return self._with_shard_seed(RoundRobinMux(part, mode=self.mode), index)

    def _repr_arguments(self) -> str:
        return f", mode={self.mode!r}"


class ChainMux(BaseMux[T]):
    """Run each streamer to its end, one after the other (``itertools.chain``).

    Parameters
    ----------
    streamers : iterable of Streamer or re-iterable, or a generator function
        The streamers, or a function (generator function, or any callable)
        yielding them, called afresh at each activation. A generator *object*
        is rejected: it could not restart.
    mode : {"exhaustive", "cycle"}
        ``exhaustive``: the pass ends after the last streamer.
        ``cycle``: then it starts again from the first, forever (a round that
        yields nothing ends the pass instead).
    random_state : None, int, numpy.random.Generator or numpy.random.RandomState
        Accepted and checked for pescador compatibility; unused.

    Examples
    --------
    >>> "".join(ChainMux(["abc", "de"]))
    'abcde'
    >>> "".join(ChainMux(["ab", "c"], mode="cycle")(max_iter=7))
    'abcabca'
    >>> def letters(n):
    ...     for letter in "xyz"[:n]:
    ...         yield Streamer(letter * 2)
    >>> "".join(ChainMux(lambda: letters(3)))
    'xxyyzz'
    """

    def __init__(
        self,
        streamers: Iterable[Streamer[T] | Iterable[T]]
        | Callable[[], Iterable[Streamer[T] | Iterable[T]]],
        mode: str = "exhaustive",
        random_state: object = None,
    ) -> None:
        self._factory_of_streamers: Callable[[], Iterable[Any]] | None
        if isinstance(streamers, Streamer):
            self._factory_of_streamers = streamers.iterate
            checked: list[Streamer[T]] = []
        elif callable(streamers) and not isinstance(streamers, Iterator):
            self._factory_of_streamers = streamers
            checked = []
        else:
            self._factory_of_streamers = None
            checked = _check_streamers(streamers)
        self.mode = _check_choice(mode, "mode", CHAIN_MODES)
        super().__init__(checked, random_state)

    def _open_sources(self) -> Iterator[Any]:
        if self._factory_of_streamers is None:
            return iter(self.streamers)
        produced = self._factory_of_streamers()
        if not isinstance(produced, Iterable):
            raise SamplingError(
                f"streamers={self._factory_of_streamers!r} returned {produced!r}, "
                "which is not iterable"
            )
        return iter(produced)

    def _make_pass(self, pass_number: int) -> _MuxPass[T]:
        return _ChainPass(self)

    def _shard(self, index: int, count: int) -> Streamer[T] | None:
        if self._factory_of_streamers is not None:
            return None
        part = self._shard_streamers(index, count)
        return self._with_shard_seed(ChainMux(part, mode=self.mode), index)

    def __repr__(self) -> str:
        if self._factory_of_streamers is not None:
            return f"ChainMux({self._factory_of_streamers!r}, mode={self.mode!r})"
        return super().__repr__()

    def _repr_arguments(self) -> str:
        return f", mode={self.mode!r}"
