"""Muxes: streamers that interleave other streamers (pescador 3.0's four, fixed).

This module owns the public muxes, :class:`StochasticMux`,
:class:`ShuffledMux`, :class:`RoundRobinMux` and :class:`ChainMux`: their
arguments, their shards and how each activation becomes one *pass*. The
sampling loop itself lives in the per-pass objects of
:mod:`feedmux.sampling._passes`, built afresh for every activation. It is
pure (no I/O, no clocks) and must never hold state set by serving code: what
a pass does when a stream raises is handed to it with the activation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from feedmux.errors import SamplingError
from feedmux.sampling._checks import (
    check_choice,
    check_positive_int,
    check_rate,
    check_streamers,
    check_weights,
)
from feedmux.sampling._passes import (
    ChainPass,
    MuxPass,
    RoundRobinPass,
    ShuffledPass,
    StochasticPass,
)
from feedmux.sampling._rng import SeedPlan, seed_plan
from feedmux.sampling.streamer import Streamer, StreamErrorHook, is_integer

__all__ = [
    "BaseMux",
    "ChainMux",
    "RoundRobinMux",
    "ShuffledMux",
    "StochasticMux",
    "pass_skipper",
    "restart_passes",
]

T = TypeVar("T")

STOCHASTIC_MODES = ("with_replacement", "single_active", "exhaustive")
DISTRIBUTIONS = ("constant", "binomial", "poisson")
ROUND_ROBIN_MODES = ("exhaustive", "cycle", "permuted_cycle")
CHAIN_MODES = ("exhaustive", "cycle")


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
        # Kept apart from the plan: a server without a seed of its own takes this one.
        self._int_seed = int(random_state) if is_integer(random_state) else None
        self._passes = 0

    @property
    def seed(self) -> int | None:
        """The integer ``random_state`` this mux was given, or None (unseeded, or a generator).

        Examples
        --------
        >>> ChainMux(["ab"], random_state=4).seed, ChainMux(["ab"]).seed
        (4, None)
        """
        return self._int_seed

    @property
    def n_streams(self) -> int:
        """The number of streamers."""
        return len(self.streamers)

    def _start(self, on_stream_error: StreamErrorHook | None) -> Iterator[T]:
        self._passes += 1
        return self._make_pass(self._passes, on_stream_error).run()

    def _restart_passes(self) -> None:
        self._passes = 0

    def _skip_pass(self) -> None:
        self._passes += 1

    def _pass_rng(self, pass_number: int) -> np.random.Generator:
        return self._seed_plan.for_pass(pass_number)

    def _make_pass(
        self, pass_number: int, on_stream_error: StreamErrorHook | None
    ) -> MuxPass[T]:
        """Build the state of pass ``pass_number`` (1-based)."""
        raise NotImplementedError

    def split(self, index: int, count: int) -> Streamer[T] | None:
        """The mux over ``streamers[index::count]``, or None if this mux cannot split so.

        What the epoch loop's :func:`~feedmux.sampling.epochs.shard` and a server's
        choice of shards ask; subclasses say how in :meth:`_shard`.

        Examples
        --------
        >>> from feedmux.sampling import ChainMux
        >>> ["".join(ChainMux(["ab", "cd", "ef"]).split(index, 2).iterate()) for index in (0, 1)]
        ['abef', 'cd']
        """
        return self._shard(index, count)

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
        checked = check_streamers(streamers)
        self.n_active = check_positive_int(n_active, "n_active")
        self.rate = check_rate(rate)
        self.mode = check_choice(mode, "mode", STOCHASTIC_MODES)
        self.dist = check_choice(dist, "dist", DISTRIBUTIONS)
        self.prune_empty_streams = bool(prune_empty_streams)
        self.weights = check_weights(weights, len(checked))
        super().__init__(checked, random_state)

    def _make_pass(
        self, pass_number: int, on_stream_error: StreamErrorHook | None
    ) -> MuxPass[T]:
        return StochasticPass(self, self._pass_rng(pass_number), on_stream_error)

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
        checked = check_streamers(streamers)
        self.weights = check_weights(weights, len(checked))
        super().__init__(checked, random_state)

    def _make_pass(
        self, pass_number: int, on_stream_error: StreamErrorHook | None
    ) -> MuxPass[T]:
        return ShuffledPass(self, self._pass_rng(pass_number), on_stream_error)

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
        checked = check_streamers(streamers)
        self.mode = check_choice(mode, "mode", ROUND_ROBIN_MODES)
        super().__init__(checked, random_state)

    def _make_pass(
        self, pass_number: int, on_stream_error: StreamErrorHook | None
    ) -> MuxPass[T]:
        rng = self._pass_rng(pass_number) if self.mode == "permuted_cycle" else None
        return RoundRobinPass(self, rng, on_stream_error)

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
        is rejected: it could not restart. An empty list yields nothing, as in
        pescador.
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
            # An empty list yields nothing, as in pescador (and as a function
            # yielding no streamers does); cycle mode ends instead of looping.
            checked = check_streamers(streamers, allow_empty=True)
        self.mode = check_choice(mode, "mode", CHAIN_MODES)
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

    def _make_pass(
        self, pass_number: int, on_stream_error: StreamErrorHook | None
    ) -> MuxPass[T]:
        return ChainPass(self._open_sources, self.mode == "cycle", on_stream_error)

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


def restart_passes(streamer: Any) -> None:
    """Set every mux reachable from ``streamer`` back before its first pass.

    A mux draws the random generator of each pass from (seed, pass number),
    so after this a seeded source runs the very passes it ran from the start
    (a server that resumes a run samples it again from the beginning). Muxes
    are found through ``streamers`` and ``source``; a mux inside a generator
    function's closure is out of reach.

    Examples
    --------
    >>> mux = ShuffledMux(["ab", "cd"], random_state=3)
    >>> first = "".join(mux(max_iter=4))
    >>> restart_passes(Streamer(mux))
    >>> "".join(mux(max_iter=4)) == first
    True
    """
    seen: set[int] = set()
    stack = [streamer]
    while stack:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, Streamer):
            continue
        seen.add(id(node))
        if isinstance(node, BaseMux):
            node._restart_passes()
            if isinstance(node.streamers, (list, tuple)):
                stack.extend(node.streamers)
        else:
            stack.append(node.source)


def pass_skipper(streamer: Any) -> Callable[[], None] | None:
    """How to skip one whole activation of ``streamer`` without running it, or None.

    A mux draws each pass's random generator from (seed, pass number) and
    starts every one of its streamers afresh in each pass, so when those
    streamers are plain ones (a generator function or a re-iterable, no mux
    and no map inside: nothing that keeps state from one pass to the next),
    counting a pass is all that running it would change. The returned
    callable does that; anything else (nested muxes, maps, custom streamers)
    gives None and must be run to be skipped, unless it says how itself: a
    streamer with a ``skipper()`` method (streamers over other streamers, such
    as a server's merged shards) returns what that gives.

    Examples
    --------
    >>> mux = ShuffledMux(["ab", "cd"], random_state=3)
    >>> whole = "".join(mux(max_iter=4)) + "".join(mux(max_iter=4))
    >>> restart_passes(mux)
    >>> skip = pass_skipper(mux)
    >>> skip()  # instead of running the first pass
    >>> "".join(mux(max_iter=4)) == whole[4:]
    True
    """
    if type(streamer) is Streamer and isinstance(streamer.source, BaseMux) and not (
            streamer.args or streamer.kwargs):
        streamer = streamer.source
    own = getattr(streamer, "skipper", None)
    if isinstance(streamer, Streamer) and callable(own):
        skip: Callable[[], None] | None = own()
        return skip
    if not isinstance(streamer, BaseMux) or type(streamer).iterate is not Streamer.iterate:
        return None
    children = streamer.streamers
    if not isinstance(children, (list, tuple)) or not all(
            type(child) is Streamer and not isinstance(child.source, Streamer)
            for child in children):
        return None
    return streamer._skip_pass
