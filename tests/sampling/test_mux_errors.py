"""What a mux does when one of its streams raises, and how the hook reaches it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import feedmux
from feedmux.sampling import EpochIterator, shard
from feedmux.sampling.streamer import activate

pytestmark = pytest.mark.timeout(10)


def failing_after(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"f{i}"
    raise OSError("disk gone")


def streams() -> list[feedmux.Streamer[str]]:
    return [feedmux.Streamer(failing_after, 2), feedmux.Streamer(["a", "b", "c"])]


def muxes() -> list[feedmux.Streamer[str]]:
    return [
        feedmux.StochasticMux(streams(), 2, rate=None, mode="exhaustive", random_state=0),
        feedmux.ShuffledMux(streams(), random_state=0),
        feedmux.RoundRobinMux(streams()),
        feedmux.ChainMux(streams()),
    ]


@pytest.mark.parametrize("mux", muxes(), ids=lambda m: type(m).__name__)
def test_an_error_propagates_by_default(mux: feedmux.Streamer[str]) -> None:
    with pytest.raises(OSError, match="disk gone"):
        list(mux.iterate(max_iter=100))


@pytest.mark.parametrize("mux", muxes(), ids=lambda m: type(m).__name__)
def test_with_a_handler_only_the_failing_stream_ends(mux: feedmux.Streamer[str]) -> None:
    errors: list[BaseException] = []
    items = list(activate(mux, 100, errors.append))
    assert {"f0", "f1", "a", "b", "c"} <= set(items)
    assert errors and all(isinstance(e, OSError) for e in errors)
    if not isinstance(mux, feedmux.ShuffledMux):  # ShuffledMux restarts its streams
        assert sorted(items) == ["a", "b", "c", "f0", "f1"]


def test_the_handler_is_not_left_behind_for_other_activations() -> None:
    mux = feedmux.ChainMux(streams())
    assert sorted(activate(mux, None, lambda error: None)) == ["a", "b", "c", "f0", "f1"]
    with pytest.raises(OSError, match="disk gone"):
        list(mux)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda mux: feedmux.ChainMux([mux, "z"]),
        lambda mux: feedmux.ChainMux([feedmux.Streamer(feedmux.Streamer(mux)), "z"]),
        lambda mux: feedmux.ChainMux(lambda: iter([mux, feedmux.Streamer("z")])),
        lambda mux: feedmux.RoundRobinMux([feedmux.Streamer(mux), "z"]),
    ],
    ids=["chain", "streamer", "chain-of-a-function", "round-robin"],
)
def test_the_handler_reaches_nested_muxes(wrap: object) -> None:
    inner = feedmux.RoundRobinMux(streams())
    outer = wrap(inner)  # type: ignore[operator]
    errors: list[BaseException] = []
    items = list(activate(outer, None, errors.append))
    # Only the inner failing stream ended: the inner mux went on with the other.
    assert sorted(items) == ["a", "b", "c", "f0", "f1", "z"]
    assert len(errors) == 1


def test_an_epoch_iterator_hands_its_handler_to_each_epoch() -> None:
    errors: list[BaseException] = []
    epochs = EpochIterator(feedmux.ChainMux(streams()), max_epochs=2, on_stream_error=errors.append)
    chunks = [epochs.take(10), epochs.take(10)]
    assert [(chunk.epoch, sorted(chunk.items), chunk.last) for chunk in chunks] == [
        (1, ["a", "b", "c", "f0", "f1"], True),
        (2, ["a", "b", "c", "f0", "f1"], True),
    ]
    assert len(errors) == 2


def test_a_shard_by_items_hands_the_handler_to_the_whole_source() -> None:
    chained = feedmux.ChainMux(lambda: iter([feedmux.RoundRobinMux(streams())]))
    errors: list[BaseException] = []
    parts = [list(activate(shard(chained, index, 2), None, errors.append)) for index in range(2)]
    assert sorted(parts[0] + parts[1]) == ["a", "b", "c", "f0", "f1"]
    assert len(errors) == 2
