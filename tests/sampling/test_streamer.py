"""Streamer and @streamable: activation, limits, cycling, argument checks."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pescador
import pytest

import feedmux.sampling as feedmux_sampling
from feedmux.errors import SamplingError
from feedmux.sampling import ChainMux, StochasticMux, Streamer, streamable
from feedmux.sampling.streamer import check_max_iter

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)


def count_up(n: int) -> Iterator[int]:
    yield from range(n)


@streamable
def letters(word: str, repeat: int = 1) -> Iterator[str]:
    for letter in word:
        yield letter * repeat


class Pulls:
    """A generator function that records how many items were pulled from it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pulled = 0
        self.closed = 0

    def __call__(self) -> Iterator[int]:
        try:
            for value in range(self.n):
                self.pulled += 1
                yield value
        finally:
            self.closed += 1


@pytest.mark.parametrize(
    "source, expected",
    [
        ([1, 2, 3], [1, 2, 3]),
        ((1, 2), [1, 2]),
        ("ab", ["a", "b"]),
        (range(3), [0, 1, 2]),
        (np.arange(3), [0, 1, 2]),
        ({"k": 1}, ["k"]),
        (Streamer([7, 8]), [7, 8]),
        (lambda: [4, 5], [4, 5]),
        (lambda: iter([4, 5]), [4, 5]),
    ],
)
def test_every_kind_of_source_restarts_at_each_activation(
    source: object, expected: list[object]
) -> None:

    stream = Streamer(source)
    assert list(stream) == expected
    assert list(stream.iterate()) == expected
    assert list(stream()) == expected


def test_generator_function_gets_its_arguments() -> None:
    stream = Streamer(count_up, 4)
    assert list(stream) == [0, 1, 2, 3]
    assert list(Streamer(letters("ab").source, "ab", repeat=2)) == ["aa", "bb"]
    assert stream.args == (4,) and stream.kwargs == {}
    assert stream.streamer is count_up  # the pescador attribute name


def test_streamable_makes_a_streamer_factory() -> None:
    stream = letters("xyz", repeat=2)
    assert isinstance(stream, Streamer)
    assert list(stream) == list(stream) == ["xx", "yy", "zz"]
    assert letters.__name__ == "letters"


def test_streamable_streamer_pickles_by_its_decorated_name() -> None:
    stream = pickle.loads(pickle.dumps(letters("ab", repeat=3)))
    assert list(stream) == ["aaa", "bbb"]
    plain = pickle.loads(pickle.dumps(Streamer(count_up, 2)))
    assert list(plain) == [0, 1]


def test_a_mux_pickles() -> None:
    mux = StochasticMux([Streamer(count_up, 3), [9]], 2, None, mode="exhaustive", random_state=5)
    copy = pickle.loads(pickle.dumps(mux))
    assert sorted(copy) == sorted(mux)


@pytest.mark.parametrize("one_shot", [(x for x in range(3)), iter([1, 2]), count_up(3)])
def test_one_shot_iterators_are_rejected_at_construction(one_shot: object) -> None:
    with pytest.raises(SamplingError, match="one-shot iterator"):
        Streamer(one_shot)


@pytest.mark.parametrize("bad", [5, 2.5, None, object()])
def test_non_iterable_sources_are_rejected(bad: object) -> None:
    with pytest.raises(SamplingError, match="source must be"):
        Streamer(bad)


def test_arguments_for_a_non_callable_source_are_rejected() -> None:
    with pytest.raises(SamplingError, match="not callable"):
        Streamer([1, 2], 3)


def test_a_callable_that_returns_a_non_iterable_fails_at_activation() -> None:
    stream = Streamer(lambda: 42)
    with pytest.raises(SamplingError, match="returned int, which is not iterable"):
        list(stream)


def test_iterate_max_iter_never_pulls_one_more_item() -> None:
    source = Pulls(10)
    stream = Streamer(source)
    assert list(stream.iterate(max_iter=3)) == [0, 1, 2]
    assert source.pulled == 3
    assert source.closed == 1  # the capped source generator is closed at once
    assert list(stream(max_iter=0)) == []
    assert source.pulled == 3


def test_cycle_max_iter_never_pulls_one_more_item() -> None:
    source = Pulls(4)
    assert list(Streamer(source).cycle(max_iter=6)) == [0, 1, 2, 3, 0, 1]
    assert source.pulled == 6


def test_cycle_restarts_forever() -> None:
    stream = Streamer(count_up, 3)
    assert list(stream.cycle(max_iter=7)) == [0, 1, 2, 0, 1, 2, 0]
    assert list(stream(max_iter=4, cycle=True)) == [0, 1, 2, 0]
    endless = stream.cycle()
    assert [next(endless) for _ in range(10)] == [0, 1, 2] * 3 + [0]


@pytest.mark.timeout(10)
def test_cycling_an_empty_streamer_raises_instead_of_hanging() -> None:
    with pytest.raises(SamplingError, match="yielded no items"):
        list(Streamer([]).cycle())
    with pytest.raises(SamplingError, match="yielded no items"):
        next(Streamer(count_up, 0)(cycle=True))


@pytest.mark.parametrize(
    "max_iter, expected",
    [(None, None), (0, 0), (3, 3), (2.5, 3), (np.int64(4), 4), (float("inf"), None)],
)
def test_max_iter_values(max_iter: object, expected: int | None) -> None:
    assert check_max_iter(max_iter) == expected


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), "3", True, [3]])
def test_bad_max_iter_is_rejected_at_the_call(bad: object) -> None:
    stream = Streamer([1])
    with pytest.raises(SamplingError, match="max_iter"):
        stream.iterate(bad)  # type: ignore[arg-type]
    with pytest.raises(SamplingError, match="max_iter"):
        stream.cycle(bad)  # type: ignore[arg-type]


def test_concurrent_iterations_are_independent() -> None:
    stream = Streamer(count_up, 4)
    first, second = stream.iterate(), stream.iterate()
    assert next(first) == 0
    assert next(first) == 1
    assert next(second) == 0
    assert list(first) == [2, 3]
    assert list(second) == [1, 2, 3]


def test_active_counts_open_activations() -> None:
    stream = Streamer(count_up, 3)
    assert stream.active == 0
    first = stream.iterate()
    assert stream.active == 0  # an activation opens at its first item
    next(first)
    assert stream.active == 1
    second = stream.iterate()
    next(second)
    assert stream.active == 2
    list(first)
    assert stream.active == 1
    second.close()
    assert stream.active == 0


def test_active_drops_when_a_source_raises() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise RuntimeError("boom")

    stream = Streamer(broken)
    with pytest.raises(RuntimeError, match="boom"):
        list(stream)
    assert stream.active == 0


def test_nested_streamers_close_their_sources() -> None:
    source = Pulls(5)
    outer = Streamer(Streamer(source))
    assert list(outer.iterate(2)) == [0, 1]
    assert source.closed == 1 and source.pulled == 2


def test_repr_names_the_source_and_arguments() -> None:
    assert repr(Streamer(count_up, 3, x=1)).startswith("Streamer(<function count_up")
    assert repr(Streamer(count_up, 3, x=1)).endswith(", 3, x=1)")


# --- pescador's stream_ and activation context -----------------------------------------

libraries = pytest.mark.parametrize("library", [pescador, feedmux_sampling],
                                    ids=["pescador", "feedmux"])


@libraries
def test_stream_is_none_on_the_streamer_before_during_and_after_iteration(
    library: ModuleType,
) -> None:
    stream = library.Streamer(count_up, 3)
    assert stream.stream_ is None
    items = stream.iterate()
    assert next(items) == 0
    assert stream.stream_ is None and stream.active == 1
    assert list(items) == [1, 2]
    assert stream.stream_ is None and stream.active == 0


@libraries
def test_with_gives_an_activated_copy_whose_stream_stays_set(library: ModuleType) -> None:
    stream = library.Streamer(count_up, 3)
    with stream as active:
        assert active is not stream
        assert stream.stream_ is None and stream.active == 1
        assert isinstance(active.stream_, Iterator)
        with active as again:
            assert again is active
        assert list(active.stream_) == [0, 1, 2]
    assert stream.active == 0
    assert isinstance(active.stream_, Iterator)
    assert list(active.stream_) == []


@libraries
def test_each_with_block_opens_a_fresh_activation(library: ModuleType) -> None:
    stream = library.Streamer(count_up, 2)
    with stream as first, stream as second:
        assert first.stream_ is not second.stream_
        assert stream.active == 2
        assert list(first.stream_) == list(second.stream_) == [0, 1]
    assert stream.active == 0


def pescador_style(library: ModuleType) -> type:
    """A subclass written against pescador: it overrides iterate and reads stream_."""

    class Doubled(library.Streamer):  # type: ignore[misc, name-defined]
        def iterate(self, max_iter: int | None = None) -> Iterator[Any]:
            with self as active:
                for count, item in enumerate(active.stream_):
                    if max_iter is not None and count >= max_iter:
                        break
                    yield 2 * item

    return Doubled


@libraries
def test_a_pescador_style_subclass_runs_alone_and_in_a_mux(library: ModuleType) -> None:
    doubled = pescador_style(library)(count_up, 3)
    assert list(doubled.iterate()) == [0, 2, 4]
    assert list(doubled.iterate(max_iter=2)) == [0, 2]
    assert list(library.ChainMux([doubled, doubled])) == [0, 2, 4, 0, 2, 4]
    assert doubled.active == 0


def test_a_mux_entered_with_with_starts_a_new_pass() -> None:
    mux = ChainMux(["ab", "c"])
    with mux as active:
        assert list(active.stream_ or ()) == ["a", "b", "c"]
    assert mux.stream_ is None and mux.active == 0

