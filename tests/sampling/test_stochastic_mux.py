"""StochasticMux and ShuffledMux: modes, pruning, weights, seeds, argument checks."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from feedmux.errors import SamplingError
from feedmux.sampling import ShuffledMux, StochasticMux, Streamer

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)


def tagged(tag: str) -> Iterator[tuple[str, int]]:
    """Infinite: (tag, position in this activation)."""
    for position in itertools.count():
        yield tag, position


class Recorder:
    """Sources that log each activation: (name, items yielded) once it closes."""

    def __init__(self) -> None:
        self.closed: list[tuple[str, int]] = []
        self.opened: list[str] = []

    def source(self, name: str, length: int | None = None) -> Streamer[str]:
        def run() -> Iterator[str]:
            self.opened.append(name)
            yielded = 0
            try:
                for _ in range(length) if length is not None else itertools.count():
                    yielded += 1
                    yield name
            finally:
                self.closed.append((name, yielded))

        return Streamer(run)


# --- argument checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"streamers": []}, "streamers must not be empty"),
        ({"streamers": 5}, "streamers must be a list .* not iterable"),
        ({"streamers": iter(["a"])}, "one-shot iterator"),
        ({"streamers": [iter("a")]}, "invalid element of streamers: .*one-shot"),
        ({"n_active": 0}, r"n_active must be an int >= 1, got n_active=0"),
        ({"n_active": 1.5}, r"n_active=1.5"),
        ({"rate": 0}, r"rate must be None or a finite number > 0, got rate=0"),
        ({"rate": -2.0}, r"rate=-2.0"),
        ({"rate": "5"}, r"rate='5'"),
        ({"mode": "exhaust"}, r"mode must be one of 'with_replacement', .* got mode='exhaust'"),
        ({"dist": "uniform"}, r"dist must be one of 'constant', .* got dist='uniform'"),
        ({"weights": [1.0]}, r"one weight per streamer \(2\), got 1"),
        ({"weights": [0, 0]}, r"at least one positive value, got weights=\[0, 0\]"),
        ({"weights": [1, -1]}, r"weights must be >= 0, got weights\[1\]=-1.0"),
        ({"weights": [1, float("nan")]}, r"weights must be finite"),
        ({"weights": ["a", "b"]}, r"weights must be a sequence of 2 numbers"),
        ({"random_state": "seed"}, r"random_state must be None, an int .* got random_state='seed'"),
        ({"random_state": -3}, r"random_state=-3"),
        ({"random_state": 1.5}, r"random_state=1.5"),
    ],
)
def test_stochastic_mux_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"streamers": ["ab", "cd"], "n_active": 1, "rate": None}
    arguments.update(kwargs)
    with pytest.raises(SamplingError, match=message):
        StochasticMux(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"streamers": []}, "streamers must not be empty"),
        ({"weights": [1, 2, 3]}, r"one weight per streamer \(2\), got 3"),
        ({"weights": [0.0, 0.0]}, "at least one positive value"),
        ({"random_state": object()}, "random_state must be None"),
    ],
)
def test_shuffled_mux_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"streamers": ["ab", "cd"]}
    arguments.update(kwargs)
    with pytest.raises(SamplingError, match=message):
        ShuffledMux(**arguments)  # type: ignore[arg-type]


def test_defaults_follow_pescador() -> None:
    mux = StochasticMux(["a", "b"], 1, 5)
    assert (mux.mode, mux.dist, mux.prune_empty_streams) == ("with_replacement", "binomial", True)
    assert mux.n_active == 1 and mux.rate == 5.0 and mux.n_streams == 2
    np.testing.assert_allclose(mux.weights, [0.5, 0.5])
    np.testing.assert_allclose(
        StochasticMux(["a", "b"], 1, 5, weights=[3, 1]).weights, [0.75, 0.25]
    )


@pytest.mark.parametrize(
    "random_state", [None, 7, np.int64(7), np.random.default_rng(1), np.random.RandomState(1)]
)
def test_every_kind_of_random_state_is_accepted(random_state: object) -> None:
    mux = StochasticMux(["ab", "cd"], 2, None, mode="exhaustive", random_state=random_state)
    assert sorted(mux) == ["a", "b", "c", "d"]


# --- modes --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["with_replacement", "single_active", "exhaustive"])
def test_items_come_from_streamers_mixed(mode: str) -> None:
    streamers = [Streamer(tagged, name) for name in "abcd"]
    mux = StochasticMux(streamers, 2, rate=4, mode=mode, random_state=0)
    items = list(mux(max_iter=64 if mode != "exhaustive" else None))
    names = Counter(name for name, _ in items)
    assert set(names) == set("abcd")


def test_with_replacement_can_activate_one_streamer_in_several_slots() -> None:
    # Two slots on two infinite streamers: the same streamer ends up in both
    # slots at some point, which shows as its positions restarting while an
    # earlier activation is still going (the position sequence is not 0, 1, 2...).
    mux = StochasticMux(
        [Streamer(tagged, name) for name in "ab"], 2, rate=3, dist="constant", random_state=0
    )
    items = list(mux(max_iter=600))
    overlapping = False
    for name in "ab":
        positions = [position for tag, position in items if tag == name]
        if any(b not in (a + 1, 0) for a, b in itertools.pairwise(positions)):
            overlapping = True
    assert overlapping


def test_single_active_never_activates_one_streamer_twice_at_once() -> None:
    mux = StochasticMux(
        [Streamer(tagged, name) for name in "abc"],
        2,
        rate=3,
        mode="single_active",
        dist="constant",
        random_state=0,
    )
    items = list(mux(max_iter=3000))
    for name in "abc":
        positions = [position for tag, position in items if tag == name]
        assert positions[:3] == [0, 1, 2]
        assert all(b == (a + 1) % 3 for a, b in itertools.pairwise(positions))


def test_exhaustive_activates_each_streamer_once_per_pass() -> None:
    recorder = Recorder()
    streamers = [
        recorder.source(name, length) for name, length in zip("abcde", [3, 0, 1, 5, 2], strict=True)
    ]
    mux = StochasticMux(streamers, 2, rate=None, mode="exhaustive", random_state=3)
    assert sorted(mux) == sorted("aaacdddddee")
    assert sorted(recorder.opened) == list("abcde")


def test_exhaustive_with_a_rate_caps_each_activation() -> None:
    mux = StochasticMux(
        ["aaaaa", "bbbbb"], 1, rate=2, mode="exhaustive", dist="constant", random_state=0
    )
    assert sorted(mux) == ["a", "a", "b", "b"]


def test_rate_none_runs_each_activation_to_its_end() -> None:
    recorder = Recorder()
    mux = StochasticMux(
        [recorder.source("a", 4), recorder.source("b", 7)], 1, rate=None, random_state=0
    )
    list(mux(max_iter=200))
    finished = [length for _, length in recorder.closed[:-1]]  # the last one was cut short
    assert sorted(set(finished)) == [4, 7]


def test_nested_muxes() -> None:
    inner = StochasticMux(["ab", "cd"], 1, rate=None, mode="exhaustive", random_state=1)
    outer = StochasticMux([inner, Streamer("xyz")], 2, rate=None, mode="exhaustive", random_state=2)
    assert sorted(outer) == sorted("abcdxyz")
    assert sorted(outer) == sorted("abcdxyz")
    shuffled = ShuffledMux([outer, "q"], random_state=0)
    assert set(shuffled(max_iter=100)) == set("abcdxyzq")


# --- pruning and ending -----------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", ["with_replacement", "single_active", "exhaustive"])
@pytest.mark.parametrize("prune", [True, False])
@pytest.mark.parametrize("rate", [None, 3])
def test_all_empty_streamers_end_the_pass(mode: str, prune: bool, rate: int | None) -> None:
    mux = StochasticMux(
        ["", [], range(0)], 2, rate=rate, mode=mode, prune_empty_streams=prune, random_state=0
    )
    assert list(mux) == []
    with pytest.raises(SamplingError, match="yielded no items"):
        list(mux(cycle=True))


@pytest.mark.timeout(10)
def test_all_empty_shuffled_mux_ends() -> None:
    assert list(ShuffledMux(["", []], random_state=0)) == []


@pytest.mark.parametrize("mode", ["with_replacement", "single_active"])
def test_pruning_stops_activating_empty_streamers(mode: str) -> None:
    recorder = Recorder()
    mux = StochasticMux(
        [recorder.source("empty", 0), recorder.source("full")], 1, rate=2, mode=mode, random_state=0
    )
    assert set(mux(max_iter=400)) == {"full"}
    assert recorder.opened.count("empty") == 1


def test_without_pruning_empty_streamers_keep_being_activated() -> None:
    recorder = Recorder()
    mux = StochasticMux(
        [recorder.source("empty", 0), recorder.source("full")],
        1,
        rate=2,
        prune_empty_streams=False,
        random_state=0,
    )
    assert set(mux(max_iter=400)) == {"full"}
    assert recorder.opened.count("empty") > 10


def test_shuffled_mux_drops_empty_streamers_and_restarts_the_others() -> None:
    recorder = Recorder()
    mux = ShuffledMux([recorder.source("empty", 0), recorder.source("ab", 2)], random_state=0)
    assert list(mux(max_iter=10)) == ["ab"] * 10
    assert recorder.opened.count("empty") == 1
    assert recorder.opened.count("ab") == 5


# --- weights ------------------------------------------------------------------------------


def test_zero_weight_streamers_are_never_activated() -> None:
    def explode() -> Iterator[str]:
        raise AssertionError("a zero-weight streamer was activated")
        yield "never"

    for mode in ["with_replacement", "single_active", "exhaustive"]:
        mux = StochasticMux(
            [Streamer(explode), "ab", Streamer(explode)],
            3,
            rate=None,
            weights=[0, 1, 0],
            mode=mode,
            random_state=0,
        )
        items = list(mux(max_iter=6))
        if mode == "exhaustive":
            assert items == ["a", "b"]
        else:
            assert len(items) == 6 and set(items) == {"a", "b"}
    shuffled = ShuffledMux([Streamer(explode), "c"], weights=[0, 1], random_state=0)
    assert list(shuffled(max_iter=3)) == ["c", "c", "c"]


def test_integer_weights_work_in_every_mux() -> None:
    mux = StochasticMux(
        ["ab", "cd"], 2, rate=None, weights=[2, 1], mode="exhaustive", random_state=0
    )
    assert sorted(mux) == list("abcd")
    assert set(ShuffledMux(["a", "b"], weights=np.array([3, 1]), random_state=0)(max_iter=50)) == {
        "a",
        "b",
    }


# --- seeds --------------------------------------------------------------------------------


def passes(mux: Streamer[str], n_passes: int, max_iter: int | None = None) -> list[str]:
    return ["".join(mux(max_iter=max_iter)) for _ in range(n_passes)]


SOURCES = ["abcd", "efg", "hijkl", "mn", "opqrs"]


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=seed),
        lambda seed: StochasticMux(SOURCES, 3, 2, random_state=seed),
        lambda seed: StochasticMux(SOURCES, 3, 2, mode="single_active", random_state=seed),
        lambda seed: ShuffledMux(SOURCES, random_state=seed),
    ],
)
def test_a_seed_reproduces_every_pass_and_passes_differ(make: object) -> None:
    first = passes(make(11), 4, max_iter=30)  # type: ignore[operator]
    again = passes(make(11), 4, max_iter=30)  # type: ignore[operator]
    other = passes(make(12), 4, max_iter=30)  # type: ignore[operator]
    assert first == again
    assert len(set(first)) == 4
    assert first != other


def test_generator_and_random_state_seeds_are_reproducible() -> None:
    for make_rng in (np.random.default_rng, np.random.RandomState):
        first = passes(
            StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=make_rng(5)), 3
        )
        again = passes(
            StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=make_rng(5)), 3
        )
        assert first == again
        assert len(set(first)) == 3


def test_a_shared_generator_gives_each_mux_its_own_order() -> None:
    rng = np.random.default_rng(0)
    one = StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=rng)
    two = StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=rng)
    assert passes(one, 2) != passes(two, 2)


def test_no_seed_follows_numpy_global_seed() -> None:
    mux = StochasticMux(SOURCES, 2, None, mode="exhaustive")
    np.random.seed(3)
    first = passes(mux, 3)
    np.random.seed(3)
    assert passes(StochasticMux(SOURCES, 2, None, mode="exhaustive"), 3) == first
    assert len(set(first)) == 3


def test_concurrent_passes_do_not_share_state() -> None:
    mux = StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=4)
    reference = passes(StochasticMux(SOURCES, 2, None, mode="exhaustive", random_state=4), 2)
    first, second = mux.iterate(), mux.iterate()
    head = next(first)
    assert "".join(second) == reference[1]
    assert head + "".join(first) == reference[0]


def test_repr_names_the_arguments() -> None:
    text = repr(StochasticMux(SOURCES, 2, None, mode="exhaustive"))
    assert text == (
        "StochasticMux(<5 streamers>, n_active=2, rate=None, mode='exhaustive', dist='binomial')"
    )
