"""What a mux does when one of its streams raises."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import feedmux
from feedmux.sampling.mux import on_stream_error

pytestmark = pytest.mark.timeout(10)


def failing_after(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"f{i}"
    raise OSError("disk gone")


def muxes() -> list[feedmux.Streamer[str]]:
    streams = [feedmux.Streamer(failing_after, 2), feedmux.Streamer(["a", "b", "c"])]
    return [
        feedmux.StochasticMux(streams, 2, rate=None, mode="exhaustive", random_state=0),
        feedmux.ShuffledMux(streams, random_state=0),
        feedmux.RoundRobinMux(streams),
        feedmux.ChainMux(streams),
    ]


@pytest.mark.parametrize("mux", muxes(), ids=lambda m: type(m).__name__)
def test_an_error_propagates_by_default(mux: feedmux.Streamer[str]) -> None:
    with pytest.raises(OSError, match="disk gone"):
        list(mux.iterate(max_iter=100))


@pytest.mark.parametrize("mux", muxes(), ids=lambda m: type(m).__name__)
def test_with_a_handler_only_the_failing_stream_ends(mux: feedmux.Streamer[str]) -> None:
    errors: list[BaseException] = []
    token = on_stream_error.set(errors.append)
    try:
        items = list(mux.iterate(max_iter=100))
    finally:
        on_stream_error.reset(token)
    assert {"f0", "f1", "a", "b", "c"} <= set(items)
    assert errors and all(isinstance(e, OSError) for e in errors)
    if not isinstance(mux, feedmux.ShuffledMux):  # ShuffledMux restarts its streams
        assert sorted(items) == ["a", "b", "c", "f0", "f1"]
