"""RoundRobinMux and ChainMux: exact outputs, pescador parity, no hangs."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pescador
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import SamplingError
from feedmux.sampling import ChainMux, RoundRobinMux, Streamer

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)


words = st.lists(st.text(alphabet="abcdefgh", max_size=5), min_size=1, max_size=5)


def test_round_robin_exhaustive_interleaves_until_all_end() -> None:
    assert "".join(RoundRobinMux(["ab", "cde", "fghi"])) == "acfbdgehi"
    assert "".join(RoundRobinMux(["", "ab", "", "c"])) == "acb"


def test_round_robin_cycle_restarts_every_streamer() -> None:
    mux = RoundRobinMux(["ab", "cde"], mode="cycle")
    assert "".join(mux(max_iter=12)) == "acbdeacbdeac"


def test_round_robin_permuted_cycle_permutes_the_first_round_too() -> None:
    firsts = set()
    for seed in range(20):
        mux = RoundRobinMux(["a", "b", "c"], mode="permuted_cycle", random_state=seed)
        rounds = "".join(mux(max_iter=30))
        assert all(sorted(rounds[i : i + 3]) == ["a", "b", "c"] for i in range(0, 30, 3))
        assert len({rounds[i : i + 3] for i in range(0, 30, 3)}) > 1  # rounds differ
        firsts.add(rounds[:3])
    assert len(firsts) > 1  # pescador always starts with "abc"


def test_round_robin_permuted_cycle_is_reproducible_per_seed() -> None:
    def take(seed: int) -> str:
        return "".join(
            RoundRobinMux(["ab", "c", "de"], mode="permuted_cycle", random_state=seed)(max_iter=40)
        )

    assert take(3) == take(3)
    assert take(3) != take(4)


def test_round_robin_rejects_an_unknown_mode() -> None:
    with pytest.raises(SamplingError, match=r"mode must be one of .* got mode='cycles'"):
        RoundRobinMux(["a"], mode="cycles")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("mode", ["cycle", "permuted_cycle"])
def test_round_robin_of_empty_streamers_ends_in_cycle_mode(mode: str) -> None:
    mux = RoundRobinMux(["", []], mode=mode, random_state=0)
    assert list(mux) == []
    with pytest.raises(SamplingError, match="yielded no items"):
        list(mux(cycle=True))


def test_chain_runs_streamers_one_after_the_other() -> None:
    assert "".join(ChainMux(["abc", "", "de"])) == "abcde"
    assert "".join(ChainMux(["ab", "c"], mode="cycle")(max_iter=8)) == "abcabcab"


def test_chain_over_a_generator_function_calls_it_at_each_activation() -> None:
    calls = []

    def streamers() -> Iterator[Streamer[str]]:
        calls.append(1)
        yield Streamer("ab")
        yield Streamer("c")

    mux = ChainMux(streamers)
    assert "".join(mux) == "abc"
    assert "".join(mux) == "abc"
    assert len(calls) == 2
    assert "".join(ChainMux(streamers, mode="cycle")(max_iter=7)) == "abcabca"


def test_chain_accepts_iterables_yielded_by_its_generator_function() -> None:
    mux = ChainMux(lambda: (letter * 2 for letter in "xy"))
    assert "".join(mux) == "xxyy"


def test_chain_rejects_a_generator_object() -> None:
    with pytest.raises(SamplingError, match="one-shot iterator"):
        ChainMux(Streamer(letter) for letter in "ab")


def test_chain_rejects_an_unknown_mode() -> None:
    with pytest.raises(SamplingError, match="mode must be one of 'exhaustive', 'cycle'"):
        ChainMux(["a"], mode="permuted_cycle")


def test_chain_reports_a_non_iterable_yielded_by_its_generator_function() -> None:
    with pytest.raises(SamplingError, match="neither a streamer nor iterable"):
        list(ChainMux(lambda: [Streamer("a"), 5]))


@pytest.mark.timeout(10)
def test_chain_of_empty_streamers_ends_in_cycle_mode() -> None:
    assert list(ChainMux(["", []], mode="cycle")) == []
    assert list(ChainMux(lambda: iter(()), mode="cycle")) == []
    with pytest.raises(SamplingError, match="yielded no items"):
        list(ChainMux(["", ""], mode="exhaustive").cycle())


def test_an_empty_round_robin_is_rejected_as_in_pescador() -> None:
    with pytest.raises(SamplingError, match="streamers must not be empty"):
        RoundRobinMux([])
    with pytest.raises(pescador.PescadorError):
        pescador.RoundRobinMux([])


def test_an_empty_chain_yields_nothing_as_in_pescador() -> None:
    assert list(ChainMux([])) == list(pescador.ChainMux([])) == []
    assert list(ChainMux([])(max_iter=5)) == list(pescador.ChainMux([])(max_iter=5)) == []


@settings(max_examples=60, deadline=None)
@given(words)
def test_round_robin_exhaustive_matches_pescador(sources: list[str]) -> None:
    ours = list(RoundRobinMux(sources))
    theirs = list(pescador.RoundRobinMux([pescador.Streamer(s) for s in sources]))
    assert ours == theirs


@settings(max_examples=60, deadline=None)
@given(words.filter(lambda sources: any(sources)), st.integers(1, 40))
def test_round_robin_cycle_matches_pescador(sources: list[str], n: int) -> None:
    ours = list(RoundRobinMux(sources, mode="cycle")(max_iter=n))
    theirs = list(
        pescador.RoundRobinMux([pescador.Streamer(s) for s in sources], mode="cycle")(max_iter=n)
    )
    assert ours == theirs


@settings(max_examples=60, deadline=None)
@given(
    words.filter(lambda sources: any(sources)),
    st.sampled_from(["exhaustive", "cycle"]),
    st.integers(1, 40),
)
def test_chain_matches_pescador(sources: list[str], mode: str, n: int) -> None:
    ours = list(ChainMux(sources, mode=mode)(max_iter=n))
    theirs = list(pescador.ChainMux([pescador.Streamer(s) for s in sources], mode=mode)(max_iter=n))
    assert ours == theirs


def test_muxes_nest_and_cycle() -> None:
    inner = RoundRobinMux(["ab", "cd"])
    outer = ChainMux([inner, Streamer("xy")])
    assert "".join(outer) == "acbdxy"
    assert "".join(outer(max_iter=9, cycle=True)) == "acbdxyacb"
    assert "".join(itertools.islice(outer.cycle(), 7)) == "acbdxya"
