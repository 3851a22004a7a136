"""EpochIterator.take: chunks of one epoch, epoch ends, deferred errors, empty sources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import feedmux
from feedmux.sampling.epochs import Chunk, EpochIterator

pytestmark = pytest.mark.timeout(10)


def test_chunks_never_span_epochs_and_mark_the_last() -> None:
    ended: list[tuple[int, int]] = []
    epochs = EpochIterator(feedmux.Streamer(range(5)), max_epochs=2,
                           on_epoch_end=lambda e, n: ended.append((e, n)))
    chunks = [epochs.take(3) for _ in range(4)]
    assert chunks == [
        Chunk(1, 0, [0, 1, 2], False), Chunk(1, 3, [3, 4], True),
        Chunk(2, 0, [0, 1, 2], False), Chunk(2, 3, [3, 4], True),
    ]
    assert ended == [(1, 5), (2, 5)]
    assert epochs.epoch_size == 5 and epochs.epochs_completed == 2
    with pytest.raises(StopIteration):
        epochs.take(3)


def test_an_epoch_ending_on_a_chunk_boundary_gives_an_empty_last_chunk() -> None:
    epochs = EpochIterator(feedmux.Streamer(range(4)), max_epochs=1)
    assert epochs.take(2) == Chunk(1, 0, [0, 1], False)
    assert epochs.take(2) == Chunk(1, 2, [2, 3], False)
    assert epochs.take(2) == Chunk(1, 4, [], True)


def test_items_before_an_error_come_first_then_the_error_then_the_next_epoch() -> None:
    def flaky() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("bad block")

    epochs = EpochIterator(feedmux.Streamer(flaky), max_epochs=2)
    assert epochs.take(10) == Chunk(1, 0, [1, 2], False)
    with pytest.raises(OSError, match="bad block"):
        epochs.take(10)
    assert epochs.take(10) == Chunk(2, 0, [1, 2], False)
    with pytest.raises(OSError):
        epochs.take(10)
    with pytest.raises(StopIteration):
        epochs.take(10)
    assert epochs.epochs_completed == 0


def test_an_empty_source_raises_instead_of_spinning() -> None:
    epochs = EpochIterator(feedmux.Streamer([]))
    for _ in range(2):
        with pytest.raises(feedmux.SamplingError, match="yielded no items"):
            epochs.take(4)


def test_take_never_pulls_past_its_limit() -> None:
    pulled: list[int] = []

    def counting() -> Iterator[int]:
        for i in range(100):
            pulled.append(i)
            yield i

    epochs = EpochIterator(feedmux.Streamer(counting))
    epochs.take(7)
    assert pulled == list(range(7))
