"""Stream over torch DataLoaders: map-style (sized) and IterableDataset (len() raises)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from feedmux.client import ManualStream, Stream
from feedmux.errors import StreamValueError


class Counting(IterableDataset):  # type: ignore[type-arg]
    """An IterableDataset without ``__len__``: its DataLoader's len() raises TypeError."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.size))


def values(batch: object) -> list[int]:
    if isinstance(batch, (list, tuple)):  # TensorDataset yields one-tensor tuples
        (batch,) = batch
    assert isinstance(batch, torch.Tensor)
    return [int(v) for v in batch.tolist()]


def test_map_style_dataloader_epochs() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=3)
    stream = Stream(loader)
    assert stream.loader is loader
    epochs = []
    while stream.increment_epoch(2):
        epochs.append([values(batch) for batch in stream.data()])
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert epochs == [expected, expected]
    assert (stream.epoch, stream.iteration) == (2, 8)


def test_shuffled_dataloader_covers_every_item_once_per_epoch() -> None:
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(
        TensorDataset(torch.arange(10)), batch_size=4, shuffle=True, generator=generator
    )
    stream = Stream(loader)
    passes = [sorted(v for batch in data for v in values(batch)) for data in stream.epochs(3)]
    assert passes == [list(range(10))] * 3


def test_iterable_dataset_loader_is_accepted_but_has_no_length() -> None:
    loader = DataLoader(Counting(5), batch_size=2)
    with pytest.raises(TypeError):
        len(loader)
    stream = Stream(loader)
    with pytest.raises(StreamValueError, match=r"loader \(DataLoader\) has no length yet"):
        stream.data()
    # an explicit epoch size works and cycles through the passes
    assert [values(batch) for batch in stream.data(5)] == [[0, 1], [2, 3], [4], [0, 1], [2, 3]]
    assert [[values(b) for b in data] for data in stream.epochs(2, epoch_size=2)] == [
        [[4], [0, 1]],
        [[2, 3], [4]],
    ]


def test_set_loader_between_dataloaders_mid_epoch() -> None:
    first = DataLoader(TensorDataset(torch.arange(6)), batch_size=2)
    second = DataLoader(TensorDataset(torch.arange(100, 104)), batch_size=2)
    stream = ManualStream(first)
    data = stream.data(n_iterations=4)
    assert values(next(data)) == [0, 1]
    stream.set_loader(second)
    assert [values(batch) for batch in data] == [[100, 101], [102, 103], [100, 101]]
    assert json.loads(json.dumps(stream.state_dict())) == {
        "class": "ManualStream",
        "epoch": 0,
        "iteration": 4,
        "mstep": 0,
    }
