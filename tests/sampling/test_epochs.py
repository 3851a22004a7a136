"""True epochs: exhaustive passes, EpochIterator, shard (property-based)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import SamplingError
from feedmux.sampling import (
    ChainMux,
    EpochIterator,
    RoundRobinMux,
    ShuffledMux,
    StochasticMux,
    Streamer,
    is_streamer,
    shard,
)
from feedmux.sampling.epochs import Chunk
from feedmux.sampling.mux import restart_passes

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)


Item = tuple[int, int]
T = TypeVar("T")


def make_streamers(lengths: list[int]) -> list[Streamer[Item]]:
    return [
        Streamer([(index, position) for position in range(length)])
        for index, length in enumerate(lengths)
    ]


def every_item(lengths: list[int]) -> Counter[Item]:
    return Counter(
        (index, position) for index, length in enumerate(lengths) for position in range(length)
    )


lengths_strategy = st.lists(st.integers(0, 6), min_size=1, max_size=8)


@st.composite
def exhaustive_muxes(draw: st.DrawFn) -> tuple[StochasticMux[Item], list[int]]:
    lengths = draw(lengths_strategy)
    n_active = draw(st.integers(1, len(lengths) + 3))
    weights = draw(
        st.none() | st.lists(st.integers(1, 5), min_size=len(lengths), max_size=len(lengths))
    )
    mux = StochasticMux(
        make_streamers(lengths),
        n_active,
        rate=None,
        weights=weights,
        mode="exhaustive",
        prune_empty_streams=draw(st.booleans()),
        dist=draw(st.sampled_from(["constant", "binomial", "poisson"])),
        random_state=draw(st.integers(0, 2**32)),
    )
    return mux, lengths


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None)
@given(exhaustive_muxes())
def test_every_exhaustive_pass_yields_every_item_exactly_once(
    case: tuple[StochasticMux[Item], list[int]],
) -> None:
    mux, lengths = case
    for _ in range(3):
        assert Counter(mux) == every_item(lengths)


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None)
@given(exhaustive_muxes())
def test_cycling_an_exhaustive_mux_gives_consecutive_complete_epochs(
    case: tuple[StochasticMux[Item], list[int]],
) -> None:
    mux, lengths = case
    expected = every_item(lengths)
    size = sum(lengths)
    if size == 0:
        with pytest.raises(SamplingError, match="yielded no items"):
            next(mux(cycle=True))
        return
    items = list(mux(max_iter=4 * size, cycle=True))
    for start in range(0, 4 * size, size):
        assert Counter(items[start : start + size]) == expected


@pytest.mark.timeout(60)
@settings(max_examples=100, deadline=None)
@given(exhaustive_muxes(), st.integers(1, 10))
def test_shards_of_an_exhaustive_mux_cover_one_epoch(
    case: tuple[StochasticMux[Item], list[int]],
    count: int,
) -> None:
    mux, lengths = case
    count = min(count, len(lengths))
    union: Counter[Item] = Counter()
    for index in range(count):
        union.update(shard(mux, index, count))
    assert union == every_item(lengths)


@pytest.mark.timeout(60)
@settings(max_examples=80, deadline=None)
@given(
    st.lists(lengths_strategy, min_size=1, max_size=4),
    st.integers(1, 6),
    st.sampled_from(["stochastic", "round_robin", "chain"]),
    st.integers(0, 2**32),
)
def test_nested_exhaustive_muxes_yield_every_item_once_per_pass(
    groups: list[list[int]],
    n_active: int,
    outer_kind: str,
    seed: int,
) -> None:
    expected: Counter[tuple[int, Item]] = Counter()
    inner = []
    for group, lengths in enumerate(groups):
        streamers = [
            Streamer([(group, (index, position)) for position in range(length)])
            for index, length in enumerate(lengths)
        ]
        inner.append(
            StochasticMux(streamers, n_active, None, mode="exhaustive", random_state=seed + group)
        )
        expected.update((group, item) for item in every_item(lengths))
    outer: Streamer[tuple[int, Item]]
    if outer_kind == "stochastic":
        outer = StochasticMux(inner, n_active, None, mode="exhaustive", random_state=seed)
    elif outer_kind == "round_robin":
        outer = RoundRobinMux(inner)
    else:
        outer = ChainMux(inner)
    for _ in range(2):
        assert Counter(outer) == expected


def test_exhaustive_passes_mix_the_streamers() -> None:
    mux = StochasticMux(make_streamers([20] * 4), 4, rate=None, mode="exhaustive", random_state=0)
    order = [index for index, _ in mux]
    switches = sum(a != b for a, b in itertools.pairwise(order))
    assert switches > 20  # a chain would switch 3 times


@pytest.mark.parametrize("n_active", [1, 3, 100])
def test_clamped_n_active_still_covers_every_item(n_active: int) -> None:
    # The epoch example of the pescador docs: k = 100 over 3 files.
    mux = StochasticMux(
        make_streamers([3, 1, 4]), n_active, rate=None, mode="exhaustive", random_state=1
    )
    assert Counter(mux) == every_item([3, 1, 4])


# --- EpochIterator -------------------------------------------------------------------------


def tagged_items(
    epochs: EpochIterator[T], limit: int = 2, max_chunks: int = 1000
) -> list[tuple[int, int, T]]:
    """Every (epoch, position, item) that ``take`` hands out until StopIteration."""
    tagged: list[tuple[int, int, T]] = []
    for _ in range(max_chunks):
        try:
            chunk = epochs.take(limit)
        except StopIteration:
            return tagged
        tagged += [(chunk.epoch, chunk.start + offset, item) for offset, item in
                   enumerate(chunk.items)]
    raise AssertionError(f"no StopIteration after {max_chunks} chunks")


def test_epoch_iterator_tags_epoch_and_position() -> None:
    mux = StochasticMux(make_streamers([2, 3]), 2, None, mode="exhaustive", random_state=0)
    ended: list[tuple[int, int]] = []
    epochs = EpochIterator(mux, max_epochs=3, on_epoch_end=lambda e, n: ended.append((e, n)))
    assert (epochs.epoch, epochs.epoch_size, epochs.epochs_completed) == (0, None, 0)
    tagged = tagged_items(epochs)
    assert [(epoch, position) for epoch, position, _ in tagged] == [
        (epoch, position) for epoch in (1, 2, 3) for position in range(5)
    ]
    for epoch in (1, 2, 3):
        assert Counter(item for e, _, item in tagged if e == epoch) == every_item([2, 3])
    assert ended == [(1, 5), (2, 5), (3, 5)]
    assert (epochs.epoch, epochs.epoch_size, epochs.epochs_completed) == (3, 5, 3)


def test_epoch_size_is_known_after_the_first_epoch_and_follows_changes() -> None:
    calls = itertools.count(3)

    def growing() -> Iterator[int]:
        yield from range(next(calls))

    epochs = EpochIterator(Streamer(growing))
    assert epochs.take(2) == Chunk(1, 0, [0, 1], False)
    assert epochs.epoch_size is None
    assert epochs.take(2) == Chunk(1, 2, [2], True)
    assert epochs.epoch_size == 3
    assert epochs.take(10) == Chunk(2, 0, [0, 1, 2, 3], True)
    assert (epochs.epoch_size, epochs.epochs_completed) == (4, 2)


def test_epoch_iterator_wraps_a_re_iterable_and_stops_at_zero_epochs() -> None:
    assert tagged_items(EpochIterator([1], max_epochs=2)) == [(1, 0, 1), (2, 0, 1)]
    assert tagged_items(EpochIterator(Streamer("ab"), max_epochs=0)) == []


@pytest.mark.timeout(10)
def test_an_empty_epoch_raises() -> None:
    with pytest.raises(SamplingError, match=r"epoch 1 of .* yielded no items"):
        tagged_items(EpochIterator(StochasticMux(["", ""], 2, None, mode="exhaustive")))
    calls = itertools.count(2, -1)

    def shrinking() -> Iterator[int]:
        yield from range(next(calls))

    with pytest.raises(SamplingError, match="epoch 3 of"):
        tagged_items(EpochIterator(Streamer(shrinking)))


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_max_epochs_is_rejected(bad: object) -> None:
    with pytest.raises(SamplingError, match="max_epochs"):
        EpochIterator(Streamer("a"), max_epochs=bad)  # type: ignore[arg-type]


def test_an_error_abandons_its_epoch_and_the_next_call_starts_the_next_one() -> None:
    calls = itertools.count(1)

    def flaky() -> Iterator[str]:
        call = next(calls)
        yield from "ab"
        if call % 2:
            raise ValueError(f"boom {call}")

    ended: list[tuple[int, int]] = []
    epochs = EpochIterator(
        Streamer(flaky), max_epochs=4, on_epoch_end=lambda e, n: ended.append((e, n))
    )
    assert epochs.take(5) == Chunk(1, 0, ["a", "b"], False)
    with pytest.raises(ValueError, match="boom 1"):
        epochs.take(5)
    assert (epochs.epoch, epochs.epochs_completed, epochs.epoch_size) == (1, 0, None)
    assert epochs.take(5) == Chunk(2, 0, ["a", "b"], True)
    assert epochs.take(5) == Chunk(3, 0, ["a", "b"], False)
    with pytest.raises(ValueError, match="boom 3"):
        epochs.take(5)
    assert tagged_items(epochs) == [(4, 0, "a"), (4, 1, "b")]
    assert ended == [(2, 2), (4, 2)]
    assert (epochs.epoch, epochs.epochs_completed, epochs.epoch_size) == (4, 2, 2)
    assert tagged_items(epochs) == []


def test_a_server_loop_can_skip_errors() -> None:
    def failing() -> Iterator[int]:
        yield from range(5)
        raise ValueError("boom")

    epochs = EpochIterator(Streamer(failing), max_epochs=3)
    seen: list[tuple[int, int]] = []
    errors = 0
    for _ in range(100):
        try:
            chunk = epochs.take(2)
        except StopIteration:
            break
        except ValueError:
            errors += 1
            continue
        seen += [(chunk.epoch, chunk.start + offset) for offset in range(len(chunk.items))]
    assert errors == 3
    assert Counter(epoch for epoch, _ in seen) == {1: 5, 2: 5, 3: 5}


def test_closing_an_epoch_iterator_closes_the_activation() -> None:
    stream = Streamer("abc")
    epochs = EpochIterator(stream)
    epochs.take(1)
    assert stream.active == 1
    epochs.close()
    assert stream.active == 0


def test_an_infinite_pass_is_one_endless_epoch() -> None:
    epochs = EpochIterator(ShuffledMux(["a", "b"], random_state=0))
    chunks = [epochs.take(25), epochs.take(25)]
    assert [(chunk.epoch, chunk.start, len(chunk.items), chunk.last) for chunk in chunks] == [
        (1, 0, 25, False), (1, 25, 25, False),
    ]
    assert epochs.epoch_size is None


# --- shard -------------------------------------------------------------------------------------


def test_is_streamer() -> None:
    assert is_streamer(Streamer("a"))
    assert is_streamer(ChainMux(["a"]))
    assert not is_streamer("a")
    assert not is_streamer(lambda: "a")


def test_one_shard_is_the_streamer_itself() -> None:
    mux = ChainMux(["ab"])
    assert shard(mux, 0, 1) is mux


@pytest.mark.parametrize(
    "make",
    [
        lambda: RoundRobinMux(make_streamers([3, 0, 2, 5, 1])),
        lambda: ChainMux(make_streamers([3, 0, 2, 5, 1])),
        lambda: ChainMux(lambda: iter(make_streamers([3, 0, 2, 5, 1]))),
        lambda: Streamer(lambda: iter(every_item([3, 0, 2, 5, 1]))),
        lambda: Streamer(ChainMux(make_streamers([3, 0, 2, 5, 1]))),
        lambda: StochasticMux(
            make_streamers([3, 0, 2, 5, 1]), 2, None, mode="exhaustive", random_state=9
        ),
    ],
)
@pytest.mark.parametrize("count", [2, 3, 5])
def test_shards_together_are_one_epoch(make: object, count: int) -> None:
    streamer = make()  # type: ignore[operator]
    union: Counter[Item] = Counter()
    for index in range(count):
        part = shard(streamer, index, count)
        assert is_streamer(part)
        union.update(part)
    assert union == every_item([3, 0, 2, 5, 1])


def test_item_level_shards_take_every_nth_item() -> None:
    parts = ["".join(shard(Streamer("abcdefg"), index, 3)) for index in range(3)]
    assert parts == ["adg", "be", "cf"]
    chained = ChainMux(lambda: iter(["abc", "defg"]))
    assert ["".join(shard(chained, index, 2)) for index in range(2)] == ["aceg", "bdf"]


def test_mux_shards_split_by_streamers_with_the_same_arguments() -> None:
    mux = StochasticMux(
        ["a", "b", "c", "d", "e"],
        4,
        rate=3,
        weights=[1, 2, 3, 4, 5],
        mode="single_active",
        prune_empty_streams=False,
        dist="poisson",
        random_state=1,
    )
    part = shard(mux, 1, 2)
    assert isinstance(part, StochasticMux)
    assert [list(s) for s in part.streamers] == [["b"], ["d"]]
    assert part.weights.tolist() == pytest.approx([2 / 6, 4 / 6])
    assert (part.n_active, part.rate, part.mode, part.dist, part.prune_empty_streams) == (
        4,
        3.0,
        "single_active",
        "poisson",
        False,
    )
    assert set(part(max_iter=40)) == {"b", "d"}  # n_active is clamped to 2 at each pass
    robin = shard(RoundRobinMux(["ab", "c", "de"], mode="cycle"), 0, 2)
    assert isinstance(robin, RoundRobinMux) and robin.mode == "cycle"
    assert "".join(robin(max_iter=8)) == "adbeadbe"
    shuffled = shard(ShuffledMux(["a", "b", "c"], weights=[1, 0, 3]), 0, 2)
    assert isinstance(shuffled, ShuffledMux)
    assert shuffled.weights.tolist() == pytest.approx([0.25, 0.75])


def test_mux_shards_have_their_own_reproducible_seeds() -> None:
    mux = StochasticMux(["ab", "ab", "cd", "cd"], 2, None, mode="exhaustive", random_state=3)

    def orders(index: int) -> list[str]:
        part = shard(mux, index, 2)
        return ["".join(part) for _ in range(6)]

    assert orders(0) == orders(0)
    assert orders(0) != orders(1)  # the same streamers, yet different orders


def test_shards_of_an_unseeded_mux_differ_too() -> None:
    mux = StochasticMux(["ab", "ab", "cd", "cd"], 2, None, mode="exhaustive")
    parts = [shard(mux, index, 2) for index in range(2)]
    orders = [["".join(part) for _ in range(6)] for part in parts]
    assert orders[0] != orders[1]


def test_a_shard_without_streamers_is_an_error() -> None:
    with pytest.raises(SamplingError, match=r"shard 3 of 4 .* has no streamers.*at most 3 workers"):
        shard(ChainMux(["a", "b", "c"]), 3, 4)
    with pytest.raises(SamplingError, match="only zero-weight streamers"):
        shard(StochasticMux(["a", "b"], 1, None, weights=[1, 0]), 1, 2)


@pytest.mark.parametrize(
    "index, count, message",
    [
        (0, 0, "count must be an int >= 1"),
        (2, 2, r"index must be in \[0, 2\)"),
        (-1, 2, r"index must be in \[0, 2\)"),
        (0.0, 2, "index must be an int"),
        (0, "2", "count must be an int"),
    ],
)
def test_bad_shard_arguments(index: object, count: object, message: str) -> None:
    with pytest.raises(SamplingError, match=message):
        shard(Streamer("ab"), index, count)  # type: ignore[arg-type]


def test_shard_needs_a_streamer() -> None:
    with pytest.raises(SamplingError, match="streamer must be a Streamer"):
        shard("abc", 0, 2)  # type: ignore[arg-type]


def everything(epochs: EpochIterator[int]) -> list[tuple[int, int, int]]:
    """(epoch, position, item) of every item the epochs give."""
    rows = []
    while True:
        try:
            chunk = epochs.take(7)
        except StopIteration:
            return rows
        rows += [(chunk.epoch, chunk.start + i, item) for i, item in enumerate(chunk.items)]


def test_resume_at_gives_what_an_uninterrupted_run_gives_from_there() -> None:
    mux = StochasticMux([Streamer(range(i * 10, i * 10 + 10)) for i in range(4)], 2,
                        rate=None, mode="exhaustive", random_state=5)
    whole = everything(EpochIterator(mux, max_epochs=3))
    for epoch, position in [(1, 0), (2, 13), (3, 39), (3, 40), (2, 0)]:
        restart_passes(mux)  # the mux's passes from the first again, as in a new server
        resumed = EpochIterator(mux, max_epochs=3)
        resumed.resume_at(epoch, position, keep=2)
        assert everything(resumed) == [row for row in whole if row[:2] >= (epoch, position)]
        assert resumed.resumed_head == [item for e, p, item in whole
                                        if e == epoch and p < min(2, position)]


def test_resume_at_refuses_bad_positions_and_a_late_call() -> None:
    epochs = EpochIterator(Streamer("abc"))
    with pytest.raises(SamplingError, match="expected an epoch >= 1 and a position >= 0"):
        epochs.resume_at(0, 3)
    epochs.take(1)
    with pytest.raises(SamplingError, match="before the first take"):
        epochs.resume_at(1, 1)


def test_on_epoch_start_runs_before_each_activation() -> None:
    calls: list[tuple[str, int]] = []

    def items():  # type: ignore[no-untyped-def]
        calls.append(("activated", len(calls)))
        yield from "ab"

    epochs = EpochIterator(Streamer(items), max_epochs=2,
                           on_epoch_start=lambda epoch: calls.append(("start", epoch)))
    epochs.take(5)
    epochs.take(5)
    assert calls == [("start", 1), ("activated", 1), ("start", 2), ("activated", 3)]


def test_whole_epochs_of_a_flat_mux_are_skipped_without_running_them() -> None:
    calls: Counter[int] = Counter()

    def items(index: int) -> Iterator[int]:
        calls[index] += 1
        yield from range(index * 10, index * 10 + 10)

    def flat() -> StochasticMux:
        return StochasticMux([Streamer(items, index) for index in range(3)], 2, rate=None,
                             mode="exhaustive", random_state=1)

    whole = everything(EpochIterator(flat(), max_epochs=4))
    calls.clear()
    resumed = EpochIterator(flat(), max_epochs=4)
    resumed.resume_at(3, 5)
    assert everything(resumed) == [row for row in whole if row[:2] >= (3, 5)]
    assert calls == {0: 2, 1: 2, 2: 2}, "epochs 1 and 2 ran"  # epochs 3 and 4 only
    # A mux inside a mux keeps state across passes: its epochs are run to be skipped.
    nested = ChainMux([flat()])
    whole = everything(EpochIterator(nested, max_epochs=3))
    restart_passes(nested)
    resumed = EpochIterator(nested, max_epochs=3)
    resumed.resume_at(3, 0)
    assert everything(resumed) == [row for row in whole if row[0] == 3]
