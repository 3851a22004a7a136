"""produce: epochs in, data messages out; what --on-error skip does to a failing stream."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import feedmux
from feedmux.protocol import Data, decode
from feedmux.sampling import EpochIterator
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import Pacer, produce

pytestmark = pytest.mark.timeout(10)


def failing_after(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"f{i}"
    raise OSError("disk gone")


def run(streamer: feedmux.Streamer[str], *, skip_errors: bool) -> list[tuple[int, list[Any]]]:
    """Produce two epochs of ``streamer``; return (epoch, samples) of every message sent."""
    sent: list[tuple[int, list[Any]]] = []

    def send(frames: Frames, n_samples: int, epoch: int) -> bool:
        message = decode(frames)
        assert isinstance(message, Data)
        samples = list(message.samples)
        assert len(samples) == n_samples
        sent.append((epoch, samples))
        return True

    produce(EpochIterator(streamer, max_epochs=2), send,
            policy=BatchPolicy(samples_per_message=2), server_id="test",
            skip_errors=skip_errors)
    return sent


def items_of(sent: list[tuple[int, list[Any]]], epoch: int) -> list[Any]:
    return sorted(item for message_epoch, samples in sent if message_epoch == epoch
                  for item in samples)


def test_without_skipping_a_stream_error_stops_production() -> None:
    mux = feedmux.ChainMux([feedmux.Streamer(failing_after, 2), "abc"])
    with pytest.raises(OSError, match="disk gone"):
        run(mux, skip_errors=False)


def test_skipping_ends_only_the_failing_stream_of_a_mux(caplog: pytest.LogCaptureFixture) -> None:
    mux = feedmux.ChainMux([feedmux.Streamer(failing_after, 2), "abc"])
    with caplog.at_level(logging.WARNING, logger="feedmux.server"):
        sent = run(mux, skip_errors=True)
    for epoch in (1, 2):
        assert items_of(sent, epoch) == ["a", "b", "c", "f0", "f1"]
    assert caplog.text.count("streamer tests.server.test_producer.failing_after(2) raised "
                             "OSError: disk gone; skipping the rest of that stream") == 2


def test_skipping_abandons_the_epoch_of_a_failing_top_level_streamer() -> None:
    sent = run(feedmux.Streamer(failing_after, 3), skip_errors=True)
    assert [items_of(sent, epoch) for epoch in (1, 2)] == [["f0", "f1", "f2"]] * 2


def test_a_sample_with_a_pool_sized_array_travels_alone() -> None:
    # Before: eight 512 KiB samples were stacked into one message (a copy of each),
    # while their owned copies already sat in the shared pool: a message took twice
    # its size there, and a 4 MiB pool stalled with the trainer holding 1.5 MiB.
    policy = BatchPolicy()
    large = {"id": 0, "x": np.zeros(512 * 128, np.int64)}
    assert policy.limit_for(large) == 1
    medium = {"x": np.zeros(64 * 128, np.int64)}  # 64 KiB: 64 of them fill 4 MiB
    assert policy.limit_for(medium) == 64


def with_an_object_at(index: int) -> Iterator[Any]:
    for i in range(4):
        yield object() if i == index else f"s{i}"


def test_a_refused_sample_is_named_by_its_epoch_position_or_skipped_and_counted() -> None:
    from feedmux.errors import ProtocolError
    from feedmux.server._sources.meters import SamplerMeter

    streamer = feedmux.Streamer(with_an_object_at, 2)
    # Before: "cannot encode sample: unsupported type object (sample 1 of 2)", a place in
    # one message, and nothing on the streamer or the way to skip it.
    with pytest.raises(ProtocolError, match=r"sample 2 of epoch 1 from tests\.server\."
                                            r"test_producer\.with_an_object_at\(2\) cannot be "
                                            r"sent: .*--on-error skip"):
        run(streamer, skip_errors=False)
    meter = SamplerMeter()
    sent: list[list[Any]] = []
    produce(EpochIterator(streamer, max_epochs=2),
            lambda frames, n, epoch: sent.append(list(decode(frames).samples)) is None,
            policy=BatchPolicy(samples_per_message=2), server_id="test", skip_errors=True,
            meter=meter)
    assert sorted(sample for samples in sent for sample in samples) == ["s0", "s0", "s1",
                                                                        "s1", "s3", "s3"]
    assert meter.errors_skipped == 2


def _numbers(count: int) -> Iterator[dict[str, int]]:
    yield from ({"id": i} for i in range(count))


@pytest.mark.parametrize("hint", [0, 48])
def test_free_messages_hold_whole_batches_of_the_trainers_largest_batch_size(hint: int) -> None:
    # Free trainers' batches are cut as they are dealt: a message of whole batches of the
    # largest batch size asked is sliced, not joined, and carries several batches (one
    # batch a message cost a batch_size=256 trainer 7x its CPU per sample).
    sizes: list[int] = []

    def send(frames: Frames, n_samples: int, epoch: int) -> bool:
        sizes.append(n_samples)
        return True

    produce(EpochIterator(feedmux.Streamer(_numbers, 1000), max_epochs=1), send,
            policy=BatchPolicy(), server_id="test", batch_hint=lambda: hint)
    assert sum(sizes) == 1000
    if hint:
        assert all(size % hint == 0 for size in sizes[:-1]), sizes
        assert max(sizes) > hint, sizes  # several batches in a message


def test_the_pacer_times_samples_and_an_empty_chunk_counts_nothing() -> None:
    # The server's own runners give the pacer each chunk's time apart from its size:
    # an empty chunk (a shard's end) must leave the time per sample as it was.
    pacer = Pacer(BatchPolicy())
    pacer.observe_time(4, 0.004)
    pacer.observe_time(0, 1.0)
    assert pacer.item_seconds == pytest.approx(0.001)
