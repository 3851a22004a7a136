"""A served dataset: how the factory takes it, how many stripes, and their merge (no sockets).

The merge here is the server's own (:class:`MergedShards` over
:class:`~feedmux.server._sources.merge.MergeOrder`), so the sequence checked is
the one a server with any number of workers sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from feedmux._worker_info import set_worker_info
from feedmux.errors import FactoryError, SamplingError
from feedmux.sampling import ChainMux, EpochIterator, Streamer
from feedmux.sampling.datasets import DatasetStreamer, dataset_of, from_dataset
from feedmux.server._sources.shards import (
    DEFAULT_SHARDS,
    MergedShards,
    ShardRandom,
    choose_shards,
)
from feedmux.server.factory import resolve_source

SIZE = 500


@pytest.fixture(autouse=True)
def _leave_no_sampling_state() -> Iterator[None]:
    yield
    ShardRandom.leave_all()
    set_worker_info(None)


class Squares:
    """A map-style dataset class: a factory of one for the server (kwargs given)."""

    def __init__(self, size: int = 10) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index * index


def served(streamer: Any, block: int, workers: int = 1, seed: int = 1) -> list[list[Any]]:
    """Two epochs of what a seeded server sends: the shards merged in the server's order."""
    parts, _ = choose_shards(streamer, item_split=workers, block=block)
    merged = MergedShards(parts, block, seed) if len(parts) > 1 else parts[0]
    epochs = []
    for epoch in (1, 2):
        if isinstance(merged, MergedShards):
            merged.start_epoch(epoch)
        epochs.append(list(merged))
    return epochs


@pytest.mark.parametrize("block", [1, 3, 16, 64])
@pytest.mark.parametrize("workers", [1, 2, 40])
def test_the_served_order_is_the_permutation_whatever_the_workers_and_block(
        block: int, workers: int) -> None:
    streamer = from_dataset(list(range(SIZE))).seeded(7)
    expected = [streamer.epoch_indices(epoch).tolist() for epoch in (1, 2)]
    assert served(streamer, block, workers) == expected
    assert expected[0] != expected[1]


def test_no_shuffle_is_in_order_and_the_stripe_count_follows_the_rules() -> None:
    streamer = from_dataset(list(range(SIZE)), shuffle=False)
    assert served(streamer, 16) == [list(range(SIZE))] * 2
    parts, why = choose_shards(streamer, block=16)
    assert len(parts) == DEFAULT_SHARDS and "16 stripes" in why
    parts, why = choose_shards(streamer, item_split=20, block=16)
    assert len(parts) == 20 and "per worker" in why
    parts, why = choose_shards(streamer, item_split=40, block=16)  # 32 blocks of 16
    assert len(parts) == 32 and "at most one shard per block of 16" in why
    parts, why = choose_shards(streamer, requested=3, block=16)
    assert len(parts) == 3 and why == "asked for"
    with pytest.raises(SamplingError, match="at most 32 shard"):
        choose_shards(streamer, requested=33, block=16)


def test_an_empty_dataset_cannot_be_sharded() -> None:
    with pytest.raises(SamplingError, match="0 items"):
        choose_shards(from_dataset([]), block=16)


def test_the_factory_serves_a_list_an_array_a_class_and_a_factory() -> None:
    assert sorted(resolve_source([3, 1, 2])) == [1, 2, 3]
    rows = resolve_source(np.arange(6).reshape(3, 2), shuffle=False)
    assert [row.tolist() for row in rows] == [[0, 1], [2, 3], [4, 5]]
    squares = resolve_source(f"{__name__}:Squares", {"size": 4}, shuffle=False)
    assert isinstance(squares, DatasetStreamer) and list(squares) == [0, 1, 4, 9]
    assert list(resolve_source(lambda: [5, 6], shuffle=False)) == [5, 6]
    wrapped = Streamer(from_dataset([1, 2]))
    assert dataset_of(wrapped) is not None
    assert list(resolve_source(wrapped, shuffle=False)) == [1, 2]


def test_no_shuffle_is_refused_for_a_streamer_and_a_mux() -> None:
    for source in (Streamer("abc"), ChainMux(["ab", "cd"])):
        with pytest.raises(FactoryError, match=r"--no-shuffle .* a streamer whose order is "
                                               r"its own"):
            resolve_source(source, shuffle=False)


def test_a_dict_is_not_taken_for_a_dataset() -> None:
    with pytest.raises(FactoryError, match="expected a feedmux Streamer or mux, or a map-style "
                                           "dataset"):
        resolve_source({"a": 1})


class Counting:
    """A list-like dataset that counts its loads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.loads = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        self.loads += 1
        return index


def test_a_resumed_one_process_run_skips_the_earlier_epochs_without_loading_them() -> None:
    # The sequence of a seeded server with one process (every stripe, merged here).
    def run(dataset: Counting, start: tuple[int, int] | None) -> list[Any]:
        parts, _ = choose_shards(from_dataset(dataset).seeded(3), block=4)
        merged = MergedShards(parts, 4, seed=3)
        epochs = EpochIterator(merged, max_epochs=3, on_epoch_start=merged.start_epoch)
        if start is not None:
            epochs.resume_at(*start)
        items = []
        while True:
            try:
                items.extend(epochs.take(1000).items)
            except StopIteration:
                return items

    whole = run(Counting(SIZE), None)
    dataset = Counting(SIZE)
    assert run(dataset, (3, 7)) == whole[2 * SIZE + 7:]
    # Epochs 1 and 2 are counted, not loaded (they were: 3 * SIZE loads); epoch 3 is
    # drawn again up to the resume point.
    assert dataset.loads == SIZE
