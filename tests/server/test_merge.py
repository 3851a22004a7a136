"""MergeOrder: the fixed order in which the server takes its workers' messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedmux.errors import FeedmuxError
from feedmux.protocol import Data, decode
from feedmux.sampling import EpochIterator, Streamer
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.merge import MESSAGE_OVERHEAD, Merge, MergeOrder, merge_block
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import produce


def merge(shards: list[list[list[int]]], block: int) -> list[int]:
    """Merge one epoch of each worker's messages (lists of samples) by the rule."""
    order = MergeOrder(len(shards), block)
    queues = [list(messages) for messages in shards]
    merged: list[int] = []
    while True:
        worker = order.next_worker()
        if queues[worker]:
            message = queues[worker].pop(0)
            merged.extend(message)
            order.took(worker, len(message))
        elif order.ended(worker):
            return merged


def cut(samples: list[int], block: int, rng: np.random.Generator) -> list[list[int]]:
    """Split ``samples`` into messages of random sizes that never cross a block boundary."""
    messages: list[list[int]] = []
    start = 0
    while start < len(samples):
        room = block - start % block
        size = int(rng.integers(1, room + 1))
        messages.append(samples[start:start + size])
        start += size
    return messages


def test_workers_take_turns_a_block_each_then_the_longer_shards_go_on() -> None:
    shards = [[[0, 1], [2, 3]], [[10, 11], [12]], [[20], [21], [22, 23], [24, 25]]]
    assert merge(shards, block=2) == [0, 1, 10, 11, 20, 21, 2, 3, 12, 22, 23, 24, 25]


@pytest.mark.parametrize("seed", range(20))
def test_the_merged_order_does_not_depend_on_message_sizes(seed: int) -> None:
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    block = int(rng.integers(1, 8))
    lengths = rng.integers(0, 40, size=int(rng.integers(1, 5)))
    samples = [list(range(1000 * worker, 1000 * worker + int(n)))
               for worker, n in enumerate(lengths)]
    orders = {tuple(merge([cut(part, block, rng) for part in samples], block))
              for _ in range(5)}
    assert len(orders) == 1
    (merged,) = orders
    assert sorted(merged) == sorted(x for part in samples for x in part)


@pytest.mark.parametrize("seed", range(10))
def test_merge_hands_out_the_fixed_order_whatever_the_arrival_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = 3
    samples = [list(range(1000 * worker, 1000 * worker + int(n)))
               for worker, n in enumerate(rng.integers(0, 20, size=3))]
    shards = [cut(part, block, rng) for part in samples]
    pending = [[(message, len(message)) for message in shard] + [("end", None)]
               for shard in shards]
    merger: Merge[object] = Merge(len(shards), block)
    merged: list[int] = []
    epoch_over = False
    while not epoch_over:
        readable = merger.readable()
        ready = [worker for worker in readable if pending[worker]]
        worker = ready[int(rng.integers(len(ready)))]  # any readable worker may come first
        item, count = pending[worker].pop(0)
        merger.put(worker, item, count, nbytes=8 * (count or 0))
        while (taken := merger.next()) is not None:
            item, epoch_over = taken
            if item != "end":
                assert isinstance(item, list)
                merged.extend(item)
    assert merged == merge(shards, block)


def test_merge_reads_ahead_up_to_its_budget_and_always_reads_the_turn() -> None:
    merge: Merge[str] = Merge(2, block=1, read_ahead=2 * MESSAGE_OVERHEAD + 20)
    assert merge.readable() == [0, 1]
    for _ in range(3):
        merge.put(1, "b", samples=1, nbytes=10)
    assert merge.readable() == [0]  # worker 1 holds its budget: only the turn is read
    assert merge.next() is None
    merge.put(0, "a", samples=1, nbytes=10)
    assert [merge.next(), merge.next()] == [("a", False), ("b", False)]
    merge.put(0, "a", samples=1, nbytes=10)
    merge.next()
    assert merge.readable() == [0, 1]  # worker 1's turn, and it holds less than its budget


def test_merge_in_arrival_order_reads_everyone_and_tells_the_end_of_the_epoch() -> None:
    merge: Merge[str] = Merge(2, block=None, read_ahead=0)
    merge.put(1, "b", samples=1, nbytes=10)
    merge.put(1, "end b", samples=None, nbytes=0)
    merge.put(0, "a", samples=1, nbytes=10)
    assert merge.readable() == [0, 1]
    assert [merge.next(), merge.next(), merge.next()] == [
        ("b", False), ("end b", False), ("a", False)]
    merge.put(0, "end a", samples=None, nbytes=0)
    assert merge.next() == ("end a", True)
    assert merge.next() is None


def test_every_epoch_starts_again_with_worker_0() -> None:
    order = MergeOrder(2, block=1)
    order.took(0, 1)
    assert order.next_worker() == 1
    assert order.ended(1) is False
    assert order.ended(0) is True
    assert order.next_worker() == 0


def test_a_message_out_of_turn_is_a_clear_error() -> None:
    order = MergeOrder(2, block=4)
    with pytest.raises(FeedmuxError, match="expected a message from sampling worker 0, got one "
                                           "from worker 1"):
        order.took(1, 1)
    order.ended(0)
    with pytest.raises(FeedmuxError, match=r"worker 0 \(ended the epoch\) out of turn"):
        order.ended(0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="expected workers >= 1 and block >= 1, got 0 and 3"):
        MergeOrder(0, 3)
    assert merge_block(None, hwm=8) == 16 and merge_block(7, hwm=8) == 7


def test_produce_never_lets_a_message_cross_a_block_boundary() -> None:
    sizes: list[int] = []

    def send(frames: Frames, n_samples: int, epoch: int) -> bool:
        message = decode(frames)
        assert isinstance(message, Data)
        sizes.append(len(message.samples))
        return True

    epochs = EpochIterator(Streamer(range(50)), max_epochs=2)
    produce(epochs, send, policy=BatchPolicy(samples_per_message=7), server_id="s", align=10)
    assert sum(sizes) == 100
    bounds = np.cumsum(sizes) % 50  # per epoch: both epochs have 50 samples
    starts = np.concatenate([[0], bounds[:-1]])
    pairs = zip(starts, sizes, strict=True)
    assert all(start // 10 == (start + size - 1) // 10 for start, size in pairs)
    assert sizes[:3] == [7, 3, 7]


@given(workers=st.integers(1, 6), block=st.integers(1, 5),
       steps=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_the_next_worker_follows_the_rule_whatever_was_taken(
        workers: int, block: int, steps: list[tuple[int, int]]) -> None:
    """next_worker (worked out once per change) is the live worker with the fewest blocks."""
    order = MergeOrder(workers, block)
    counts, ended = [0] * workers, [False] * workers
    for end_it, samples in steps:
        live = [index for index in range(workers) if not ended[index]]
        expected = min(live, key=lambda index: (counts[index] // block, index))
        assert order.next_worker() == expected
        assert order.next_worker() == expected  # asked again: the same answer
        if end_it == 0:
            ended[expected] = True
            if order.ended(expected):
                counts, ended = [0] * workers, [False] * workers
        else:
            order.took(expected, samples)
            counts[expected] += samples
