"""A map-style dataset as a streamer: the permutations, the stripes and their errors, no sockets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import feedmux
from feedmux.errors import SamplingError
from feedmux.sampling import EpochIterator, shard
from feedmux.sampling.datasets import (
    DatasetStreamer,
    from_dataset,
    is_map_dataset,
    stripe_positions,
)
from feedmux.sampling.mux import pass_skipper, restart_passes

SIZE = 103  # not a multiple of any stripe width used below


class Recording:
    """A dataset that records every index it is asked for."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self.asked: list[Any] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        self.asked.append(index)
        return np.full(2, index), index


def labels(streamer: Any) -> list[int]:
    return [int(label) for _, label in streamer]


def merged(parts: list[DatasetStreamer[Any]], width: int) -> list[Any]:
    """The shards' items, ``width`` from each in turn (the server's merge, modelled here)."""
    streams = [iter(part) for part in parts]
    out: list[Any] = []
    live = list(range(len(parts)))
    while live:
        for index in list(live):
            block = [item for _, item in zip(range(width), streams[index], strict=False)]
            out.extend(block)
            if len(block) < width:
                live.remove(index)
    return out


def test_every_epoch_is_a_seeded_permutation_different_from_the_last() -> None:
    dataset = Recording()
    streamer = from_dataset(dataset, random_state=5)
    epochs = [labels(streamer) for _ in range(3)]
    assert all(sorted(epoch) == list(range(SIZE)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3
    assert dataset.asked == [index for epoch in epochs for index in epoch]
    assert all(type(index) is int for index in dataset.asked)  # Python ints, as datasets expect
    again = from_dataset(Recording(), random_state=5)
    assert [labels(again) for _ in range(3)] == epochs
    restart_passes(streamer)
    assert labels(streamer) == epochs[0]
    assert labels(from_dataset(Recording(), random_state=6)) != epochs[0]


def test_no_shuffle_keeps_the_order() -> None:
    streamer = from_dataset(Recording(), shuffle=False)
    assert labels(streamer) == labels(streamer) == list(range(SIZE))


@pytest.mark.parametrize("count, width", [(1, 1), (2, 1), (3, 16), (7, 4), (7, 16)])
def test_stripes_merged_block_by_block_give_the_permutation(count: int, width: int) -> None:
    whole = from_dataset(Recording(), random_state=9)
    expected = whole.epoch_indices(1).tolist()
    dataset = Recording()
    parts = from_dataset(dataset, random_state=9).stripes(count, width)
    assert [int(label) for _, label in merged(parts, width)] == expected
    # Each stripe loads only its own positions of the permutation: every index once.
    assert sorted(dataset.asked) == list(range(SIZE))
    for index, part in enumerate(parts):
        mine = stripe_positions(SIZE, index, count, width)
        assert part.epoch_indices(1).tolist() == [expected[p] for p in mine]
        assert len(part) == len(mine)


def test_the_order_does_not_depend_on_the_stripe_count() -> None:
    orders = {count: [int(label) for _, label in merged(
        from_dataset(Recording(), random_state=3).stripes(count, 8), 8)]
        for count in (1, 2, 5, 13)}
    assert len({tuple(order) for order in orders.values()}) == 1


def test_shard_splits_by_positions_and_each_item_comes_once() -> None:
    streamer = from_dataset(Recording(), random_state=2)
    parts = [shard(streamer, index, 3) for index in range(3)]
    assert sorted(label for part in parts for label in labels(part)) == list(range(SIZE))


def test_an_unseeded_shuffled_streamer_is_not_split() -> None:
    # Its stripes would each draw their own permutation: items lost and repeated.
    with pytest.raises(SamplingError, match="give it a random_state"):
        shard(from_dataset(Recording()), 0, 2)
    assert len(from_dataset(Recording(), shuffle=False).stripes(2)) == 2
    assert len(from_dataset(Recording()).seeded(1).stripes(2)) == 2


def test_a_whole_epoch_is_skipped_without_loading_it() -> None:
    dataset = Recording()
    streamer = from_dataset(dataset, random_state=4)
    whole = from_dataset(Recording(), random_state=4)
    uninterrupted = [labels(whole) for _ in range(2)]
    epochs = EpochIterator(streamer, max_epochs=2)
    epochs.resume_at(2, 10)
    chunk = epochs.take(SIZE)
    assert (chunk.epoch, chunk.start) == (2, 10)
    assert [int(label) for _, label in chunk.items] == uninterrupted[1][10:]
    assert len(dataset.asked) == SIZE  # epoch 1 was counted, not loaded
    assert pass_skipper(streamer) is not None


def test_a_failing_item_is_skipped_with_the_hook() -> None:
    class Failing(Recording):
        def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
            if index == 7:
                raise OSError("corrupt file 7")
            return super().__getitem__(index)

    errors: list[BaseException] = []
    epochs = EpochIterator(from_dataset(Failing(), shuffle=False), on_stream_error=errors.append)
    chunk = epochs.take(SIZE + 1)
    assert [int(label) for _, label in chunk.items] == [i for i in range(SIZE) if i != 7]
    assert [str(error) for error in errors] == ["corrupt file 7"]
    with pytest.raises(OSError, match="corrupt file 7"):
        labels(from_dataset(Failing(), shuffle=False))


def test_seeded_and_ordered_copies_leave_the_original_alone() -> None:
    streamer = from_dataset(Recording())
    assert streamer.seed is None
    seeded = streamer.seeded(8)
    assert seeded.seed == 8 and streamer.seed is None
    assert labels(seeded) == labels(from_dataset(Recording(), random_state=8))
    assert streamer.seeded(8).seeded(9).seed == 8  # a seed given is kept
    ordered = seeded.ordered()
    assert labels(ordered) == list(range(SIZE)) and seeded.shuffle
    generator_seeded = from_dataset(Recording(), random_state=np.random.default_rng(1))
    assert generator_seeded.seeded(3) is generator_seeded


@pytest.mark.parametrize("dataset", [[1, 2], np.zeros((4, 2)), range(3), (1,)])
def test_what_is_a_map_style_dataset(dataset: Any) -> None:
    assert is_map_dataset(dataset)
    assert len(list(from_dataset(dataset))) == len(dataset)


@pytest.mark.parametrize("obj, message", [
    ({"a": 1}, "expected a map-style dataset .* got dict"),
    ("abc", "expected a map-style dataset .* got str"),
    (42, "expected a map-style dataset .* got int"),
    (np.float64(1.0), "expected a map-style dataset"),
    (np.array(3), "len\\(\\) of the dataset ndarray failed: TypeError"),
])
def test_what_is_not_a_dataset_is_refused_saying_what_came(obj: Any, message: str) -> None:
    with pytest.raises(SamplingError, match=message):
        from_dataset(obj)


def test_a_torch_iterable_dataset_is_refused_with_the_fix() -> None:
    # Named and placed as torch's, so the check needs no torch here.
    iterable_dataset = type("IterableDataset", (), {
        "__module__": "torch.utils.data.dataset", "__len__": lambda self: 3,
        "__getitem__": lambda self, index: index, "__iter__": lambda self: iter(range(3))})
    mine = type("Lines", (iterable_dataset,), {})
    with pytest.raises(SamplingError, match=r"IterableDataset.*feedmux.Streamer\(dataset\)"):
        from_dataset(mine())


def test_a_failing_len_and_too_many_stripes_are_refused() -> None:
    class Odd(Recording):
        def __len__(self) -> Any:
            return -1

    with pytest.raises(SamplingError, match="len\\(\\) of the dataset Odd failed: ValueError"):
        from_dataset(Odd())
    with pytest.raises(SamplingError, match="103 items, 7 block\\(s\\) of 16: at most 7"):
        from_dataset(Recording()).stripes(8, 16)
    with pytest.raises(SamplingError, match="stripe width >= 1"):
        from_dataset(Recording()).stripes(2, 0)


def test_from_dataset_is_public() -> None:
    assert feedmux.from_dataset is from_dataset
    assert "from_dataset" in feedmux.__all__


@pytest.mark.parametrize("size", [0, 1, 5, 16, 17, 100])
@pytest.mark.parametrize("count, width", [(1, 1), (2, 1), (3, 2), (7, 16)])
def test_stripe_positions_are_the_blocks_dealt_in_turn(size: int, count: int, width: int) -> None:
    positions = np.arange(size)
    for index in range(count):
        rule = positions[(positions // width) % count == index]  # block b to shard b % count
        assert stripe_positions(size, index, count, width).tolist() == rule.tolist()


def test_the_stripes_of_one_process_draw_the_permutation_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    streamer = from_dataset(list(range(SIZE)), random_state=1)
    parts = streamer.stripes(4, 2)
    draws: list[int] = []
    original = DatasetStreamer._pass_rng

    def counted(self: DatasetStreamer[Any], pass_number: int) -> np.random.Generator:
        draws.append(pass_number)
        return original(self, pass_number)

    monkeypatch.setattr(DatasetStreamer, "_pass_rng", counted)
    indices = [part.epoch_indices(1).tolist() for part in parts]
    assert draws == [1]
    assert sorted(index for part in indices for index in part) == list(range(SIZE))
