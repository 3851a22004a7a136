"""Statistics of rate, dist and weights, against theory and against pescador 3.0.

Every test uses fixed seeds, so it is deterministic; the tolerances are still
set at five or more standard errors, so that a change of seed (or of the
order in which random numbers are drawn) would not make them flake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pescador
import pytest

import feedmux.sampling as feedmux_sampling
from feedmux.sampling import ShuffledMux, StochasticMux, Streamer

# Every test here takes seconds: a hang is a bug, so fail it early; the bound leaves room
# for a loaded parallel run (the pescador comparisons took 30 s at a load of 28 on 2 cores).
pytestmark = pytest.mark.timeout(120)


N_ITEMS = 20_000


def activations(
    library: ModuleType,
    n_streams: int,
    n_active: int,
    rate: float | None,
    *,
    seed: int,
    n_items: int = N_ITEMS,
    **options: Any,
) -> tuple[list[int], list[int]]:
    """Draw n_items from a StochasticMux over infinite streamers.

    Returns the items (streamer indices) and the number of items each
    activation that ended *yielded* (its pulls, less the extra item pescador
    pulls before it stops).
    """
    pulls: list[int] = []

    def endless(index: int) -> Iterator[int]:
        pulled = 0
        try:
            while True:
                pulled += 1
                yield index
        finally:
            pulls.append(pulled)

    streamers = [library.Streamer(endless, index) for index in range(n_streams)]
    mux = library.StochasticMux(streamers, n_active, rate, random_state=seed, **options)
    iterator = mux.iterate()
    items = [next(iterator) for _ in range(n_items)]
    ended = list(pulls)
    iterator.close()
    extra = 1 if library is pescador else 0
    return items, [count - extra for count in ended]


def shares(items: list[int], n_streams: int) -> np.ndarray:
    counts = Counter(items)
    return np.array([counts[index] for index in range(n_streams)]) / len(items)


@pytest.mark.parametrize("rate, expected", [(8, 8), (2.5, 3), (1, 1)])
def test_constant_dist_caps_every_activation_at_rate(rate: float, expected: int) -> None:
    _, lengths = activations(feedmux_sampling, 8, 4, rate, dist="constant", seed=0, n_items=4000)
    assert len(lengths) > 4000 / (expected + 1)
    assert set(lengths) == {expected}


def test_poisson_dist_has_mean_rate_and_variance_rate_minus_one() -> None:
    _, lengths = activations(feedmux_sampling, 8, 4, 8, dist="poisson", seed=0)
    # ~2500 activations: standard error of the mean ~0.05, of the variance ~0.2
    assert np.mean(lengths) == pytest.approx(8, abs=0.3)
    assert np.var(lengths) == pytest.approx(7, abs=1.2)
    assert min(lengths) >= 1


def test_binomial_dist_matches_pescador() -> None:
    # With 4 equal slots p = 1/4: n = floor(7 / 0.75) = 9 trials of 0.75, so
    # the mean is 1 + 9 * 0.75 = 7.75 and the variance 9 * 0.75 * 0.25 = 1.69.
    ours = [activations(feedmux_sampling, 8, 4, 8, dist="binomial", seed=seed)[1]
            for seed in (0, 1)]
    theirs = [activations(pescador, 8, 4, 8, dist="binomial", seed=seed)[1] for seed in (0, 1)]
    for lengths in ours + theirs:
        assert np.mean(lengths) == pytest.approx(7.75, abs=0.15)
        assert np.var(lengths) == pytest.approx(1.69, abs=0.4)
        assert min(lengths) >= 1
    ours_all = np.concatenate(ours)
    theirs_all = np.concatenate(theirs)
    assert np.mean(ours_all) == pytest.approx(np.mean(theirs_all), abs=0.15)


def test_binomial_with_one_slot_falls_back_to_poisson() -> None:
    _, lengths = activations(feedmux_sampling, 4, 1, 6, dist="binomial", seed=2)
    assert np.mean(lengths) == pytest.approx(6, abs=0.3)
    assert np.var(lengths) == pytest.approx(5, abs=1.0)


@pytest.mark.parametrize("n_active", [1, 2, 4])
@pytest.mark.parametrize("dist", ["binomial", "poisson", "constant"])
def test_long_run_shares_follow_the_weights(n_active: int, dist: str) -> None:
    weights = np.array([4.0, 3.0, 2.0, 1.0])
    items, _ = activations(feedmux_sampling, 4, n_active, 4, weights=weights, dist=dist, seed=1)
    # ~5000 activations of ~4 items: standard error of a share below 0.01
    np.testing.assert_allclose(shares(items, 4), weights / weights.sum(), atol=0.04)


def test_active_streams_are_sampled_in_proportion_to_their_weights() -> None:
    # Every streamer active all the time: only the per-sample slot draw acts.
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    items, _ = activations(
        feedmux_sampling, 4, 4, None, weights=weights, mode="single_active", seed=3
    )
    # standard error of a share ~0.003
    np.testing.assert_allclose(shares(items, 4), weights / weights.sum(), atol=0.02)


def test_uniform_slot_draws_are_uniform() -> None:
    items, _ = activations(
        feedmux_sampling, 32, 32, None, mode="single_active", seed=4, n_items=64_000
    )
    counts = np.bincount(items, minlength=32)
    chi_square = ((counts - 2000) ** 2 / 2000).sum()
    assert chi_square < 80  # 31 degrees of freedom: the 1e-6 quantile is ~ 85


def test_exhaustive_activation_order_follows_the_weights() -> None:
    weights = np.array([4.0, 3.0, 2.0, 1.0])
    mux = StochasticMux(
        [[index] for index in range(4)], 1, None, weights=weights, mode="exhaustive", random_state=5
    )
    firsts = Counter(next(iter(mux)) for _ in range(4000))
    observed = np.array([firsts[index] for index in range(4)]) / 4000
    # standard error ~0.008
    np.testing.assert_allclose(observed, weights / weights.sum(), atol=0.04)


def test_shuffled_mux_shares_follow_the_weights_like_pescador() -> None:
    weights = [0.5, 0.25, 0.25]
    for library in (feedmux_sampling, pescador):
        mux = library.ShuffledMux(
            [library.Streamer(letter) for letter in "abc"], weights=weights, random_state=6
        )
        sample = list(mux(max_iter=N_ITEMS))
        observed = np.array([sample.count(letter) for letter in "abc"]) / N_ITEMS
        # standard error ~0.004
        np.testing.assert_allclose(observed, weights, atol=0.02)


def test_shuffled_mux_weights_are_used_exactly_when_streamers_restart() -> None:
    # A streamer of length 1 restarts after each item; its share must not change.
    mux = ShuffledMux([Streamer("a"), Streamer("bbbbbbbbbb")], weights=[1, 3], random_state=7)
    sample = list(mux(max_iter=N_ITEMS))
    assert sample.count("a") / N_ITEMS == pytest.approx(0.25, abs=0.02)
