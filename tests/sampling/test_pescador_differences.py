"""Every place where feedmux deliberately differs from pescador 3.0, pinned.

Each test shows pescador's behaviour next to feedmux's where running
pescador is safe (it would hang on the cases of difference 5, so those run
feedmux only, under a timeout). The numbers follow the issue's list; the
last ones are differences the issue did not list but that come with the
fixes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pescador
import pytest

import feedmux.sampling as feedmux_sampling
from feedmux.errors import DataError, SamplingError
from feedmux.sampling import (
    ChainMux,
    RoundRobinMux,
    ShuffledMux,
    StochasticMux,
    Streamer,
    tuples,
)

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)



def endless(letter: str) -> Iterator[str]:
    yield from itertools.repeat(letter)


# 1. n_active larger than the number of streamers is clamped, in every mode -----------


@pytest.mark.parametrize("mode", ["exhaustive", "single_active"])
def test_1_n_active_beyond_the_streamers_is_clamped(mode: str) -> None:
    # The epoch example of the pescador docs: 100 active streams over 3 files.
    with pytest.raises(pescador.PescadorError, match="n_active=100"):
        pescador.StochasticMux(
            [pescador.Streamer(s) for s in ["ab", "c", "de"]], 100, rate=None, mode=mode
        )
    mux = StochasticMux(["ab", "c", "de"], 100, rate=None, mode=mode, random_state=0)
    items = list(mux(max_iter=5 if mode == "exhaustive" else 50))
    assert set(items) == set("abcde")
    if mode == "exhaustive":
        assert sorted(items) == list("abcde")


@pytest.mark.parametrize("library, expected", [(pescador, 10), (feedmux_sampling, 2)])
def test_1_with_replacement_is_clamped_too(library: ModuleType, expected: int) -> None:
    # Two streamers, ten requested slots: pescador keeps ten activations open
    # (the same streamer in several slots); feedmux keeps two.
    opened: list[str] = []

    def source(letter: str) -> Iterator[str]:
        opened.append(letter)
        yield from itertools.repeat(letter)

    streamers = [library.Streamer(source, letter) for letter in "ab"]
    mux = library.StochasticMux(streamers, 10, rate=None, random_state=0)
    assert len(list(mux(max_iter=200))) == 200
    assert len(opened) == expected


# 2. each pass has its own reproducible order ----------------------------------------------


def test_2_a_seeded_mux_orders_each_pass_differently() -> None:
    sources = ["abc", "def", "ghi"]
    theirs = pescador.StochasticMux(
        [pescador.Streamer(s) for s in sources], 1, None, mode="exhaustive", random_state=0
    )
    assert len({"".join(theirs) for _ in range(5)}) == 1  # pescador replays one order
    ours = StochasticMux(sources, 1, None, mode="exhaustive", random_state=0)
    epochs = ["".join(ours) for _ in range(5)]
    assert len(set(epochs)) > 1
    again = StochasticMux(sources, 1, None, mode="exhaustive", random_state=0)
    assert ["".join(again) for _ in range(5)] == epochs


@pytest.mark.parametrize("make_rng", [np.random.default_rng, np.random.RandomState])
def test_2_a_generator_or_random_state_seeds_reproducibly(make_rng: type) -> None:
    if make_rng is np.random.default_rng:
        with pytest.raises(pescador.PescadorError, match="Invalid random_state"):
            pescador.StochasticMux([pescador.Streamer("a")], 1, None, random_state=make_rng(0))
    runs = []
    for _ in range(2):
        mux = StochasticMux(
            ["ab", "cd", "ef"], 2, None, mode="exhaustive", random_state=make_rng(4)
        )
        runs.append(["".join(mux) for _ in range(4)])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1


# 3. weights steer activation; zero weights never end a mux early ---------------------------


def long_run_shares(library: ModuleType, n_active: int) -> np.ndarray:
    streamers = [library.Streamer(endless, letter) for letter in "ab"]
    mux = library.StochasticMux(streamers, n_active, 4, weights=[3.0, 1.0], random_state=0)
    sample = list(mux(max_iter=20_000))
    return np.array([sample.count("a"), sample.count("b")]) / len(sample)


@pytest.mark.parametrize("n_active", [1, 2])
def test_3_the_long_run_share_follows_the_weights(n_active: int) -> None:
    # pescador draws the active streamers uniformly: in the long run each
    # gets the same share whatever its weight.
    np.testing.assert_allclose(long_run_shares(pescador, n_active), [0.5, 0.5], atol=0.05)
    np.testing.assert_allclose(long_run_shares(feedmux_sampling, n_active), [0.75, 0.25], atol=0.04)


def test_3_a_zero_weight_streamer_never_ends_a_mux_early() -> None:
    pescador_outputs = []
    for seed in range(6):
        theirs = pescador.StochasticMux(
            [pescador.Streamer("ab"), pescador.Streamer("cd")],
            1,
            None,
            weights=[1.0, 0.0],
            random_state=seed,
        )
        pescador_outputs.append("".join(theirs(max_iter=6)))
        ours = StochasticMux(["ab", "cd"], 1, None, weights=[1.0, 0.0], random_state=seed)
        assert "".join(ours(max_iter=6)) == "ababab"
    assert "" in pescador_outputs  # pescador activated "cd" with weight 0 and stopped


# 4. iterate(max_iter) never pulls an extra item ---------------------------------------------


@pytest.mark.parametrize("library, expected_pulls", [(pescador, 4), (feedmux_sampling, 3)])
def test_4_iterate_never_pulls_an_extra_item(library: ModuleType, expected_pulls: int) -> None:
    pulled = []

    def source() -> Iterator[int]:
        for value in range(10):
            pulled.append(value)
            yield value

    streamer = library.Streamer(source)
    assert list(streamer.iterate(max_iter=3)) == [0, 1, 2]
    assert len(pulled) == expected_pulls


# 5. nothing hangs (pescador would: only feedmux runs) ---------------------------------------


@pytest.mark.timeout(10)
def test_5_nothing_hangs() -> None:
    with pytest.raises(SamplingError, match="yielded no items"):
        next(Streamer([]).cycle())
    for prune in (True, False):
        for mode in ("with_replacement", "single_active", "exhaustive"):
            assert list(StochasticMux(["", ""], 2, 3, mode=mode, prune_empty_streams=prune)) == []
    assert list(ChainMux(["", ""], mode="cycle")) == []
    assert list(RoundRobinMux(["", ""], mode="cycle")) == []
    assert list(RoundRobinMux(["", ""], mode="permuted_cycle")) == []
    with pytest.raises(SamplingError, match="yielded no items"):
        next(ChainMux([""]).cycle())


@pytest.mark.timeout(10)
def test_5_an_empty_chain_in_cycle_mode_ends() -> None:
    # pescador fails on the first draw (a StopIteration escaping its generator).
    with pytest.raises(RuntimeError, match="StopIteration"):
        list(pescador.ChainMux([], mode="cycle"))
    assert list(ChainMux([], mode="cycle")) == []
    with pytest.raises(SamplingError, match="yielded no items"):
        next(ChainMux([], mode="cycle").cycle())


# 6. single_active prunes; RoundRobinMux checks its mode and permutes round 1; int weights ----


@pytest.mark.parametrize("library, pruned", [(pescador, False), (feedmux_sampling, True)])
def test_6_single_active_prunes_empty_streamers(library: ModuleType, pruned: bool) -> None:
    opened: list[str] = []

    def source(name: str, length: int | None) -> Iterator[str]:
        opened.append(name)
        yield from itertools.repeat(name, *([] if length is None else [length]))

    mux = library.StochasticMux(
        [library.Streamer(source, "empty", 0), library.Streamer(source, "full", None)],
        1,
        2,
        mode="single_active",
        random_state=0,
    )
    assert set(mux(max_iter=400)) == {"full"}
    assert (opened.count("empty") == 1) is pruned  # pescador revives it: ~190 activations


def test_6_round_robin_rejects_an_unknown_mode() -> None:
    pescador.RoundRobinMux([pescador.Streamer("a")], mode="bogus")  # accepted silently
    with pytest.raises(SamplingError, match="mode must be one of"):
        RoundRobinMux(["a"], mode="bogus")


def test_6_permuted_cycle_permutes_the_first_round() -> None:
    theirs = {
        "".join(
            pescador.RoundRobinMux(
                [pescador.Streamer(s) for s in "abc"], mode="permuted_cycle", random_state=seed
            )(max_iter=3)
        )
        for seed in range(10)
    }
    assert theirs == {"abc"}
    ours = {
        "".join(RoundRobinMux(list("abc"), mode="permuted_cycle", random_state=seed)(max_iter=3))
        for seed in range(10)
    }
    assert len(ours) > 1


def test_6_integer_weights_work() -> None:
    with pytest.raises(TypeError):  # numpy refuses pescador's in-place float division
        pescador.StochasticMux(
            [pescador.Streamer("ab"), pescador.Streamer("cd")], 1, None, weights=[1, 2]
        )
    assert sorted(StochasticMux(["ab", "cd"], 1, None, weights=[1, 2], mode="exhaustive")) == list(
        "abcd"
    )
    assert len(list(ShuffledMux(["ab", "cd"], weights=[1, 2])(max_iter=5))) == 5


# 7. a one-shot source is rejected at construction ---------------------------------------------


def test_7_a_generator_object_is_rejected_at_construction() -> None:
    theirs = pescador.Streamer(x for x in range(3))  # accepted; fails when iterated
    with pytest.raises(TypeError):
        list(theirs)
    with pytest.raises(SamplingError, match="one-shot iterator"):
        Streamer(x for x in range(3))
    with pytest.raises(SamplingError, match="one-shot iterator"):
        ChainMux(Streamer(s) for s in "ab")


# Beyond the list ------------------------------------------------------------------------


def test_a_draw_that_hits_an_ended_stream_is_served_by_its_restart() -> None:
    # pescador draws again, so a streamer of length 1 gets half its weight.
    weights = [1.0, 3.0]
    theirs = pescador.ShuffledMux(
        [pescador.Streamer("a"), pescador.Streamer("b" * 10)], weights=weights, random_state=0
    )
    sample = list(theirs(max_iter=20_000))
    assert sample.count("a") / len(sample) == pytest.approx(0.14, abs=0.02)
    ours = ShuffledMux([Streamer("a"), Streamer("b" * 10)], weights=weights, random_state=0)
    sample = list(ours(max_iter=20_000))
    assert sample.count("a") / len(sample) == pytest.approx(0.25, abs=0.02)


def test_arguments_for_a_source_that_takes_none_are_an_error() -> None:
    assert list(pescador.Streamer([1, 2], 3)) == [1, 2]  # silently ignored
    with pytest.raises(SamplingError, match="not callable"):
        Streamer([1, 2], 3)


def test_arguments_are_checked_when_a_map_is_called() -> None:
    pescador.tuples([{"a": 1}])  # no error until iterated
    with pytest.raises(SamplingError, match="at least one key"):
        tuples([{"a": 1}])


def test_a_missing_key_is_a_data_error_and_still_a_key_error() -> None:
    with pytest.raises(KeyError):
        next(pescador.tuples(iter([{"a": 1}]), "b"))
    with pytest.raises(DataError, match="item 0 has no key 'b'") as caught:
        next(tuples([{"a": 1}], "b"))
    assert isinstance(caught.value, KeyError)


def test_every_pass_covers_an_epoch_even_with_a_rate_of_none_and_k_equal_one() -> None:
    # Not a difference in itself, but the base of every epoch: both libraries
    # give each item once per exhaustive pass.
    sources = ["abc", "", "de", "f"]
    theirs = pescador.StochasticMux(
        [pescador.Streamer(s) for s in sources], 1, None, mode="exhaustive", random_state=0
    )
    ours = StochasticMux(sources, 1, None, mode="exhaustive", random_state=0)
    assert Counter(theirs) == Counter(ours) == Counter("abcdef")
