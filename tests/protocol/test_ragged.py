"""Bucketed batches of variable-length arrays: padded on the wire, a list or a mask at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import Data, Padded, SampleBatch, decode, encode, padded_batch, ragged_tree


def samples(lengths: list[int]) -> list[dict[str, Any]]:
    return [{"tokens": np.arange(n, dtype=np.float32).reshape(n, 1) + i, "label": i,
             "fixed": np.full(3, i), "name": f"s{i}"} for i, n in enumerate(lengths)]


def through_the_wire(batch: SampleBatch) -> Any:
    tags = np.zeros((len(batch), 2), dtype=np.int64)
    message = decode([bytes(frame) for frame in encode(Data(tags, batch, "s"))])
    assert isinstance(message, Data) and type(message.samples) is SampleBatch
    return message.samples.stacked()


@pytest.mark.parametrize("lengths", [[2, 5, 1, 0], [4, 4, 4]])
def test_length_led_leaves_arrive_as_lists_or_padded_with_a_mask(lengths: list[int]) -> None:
    batch = samples(lengths)
    tree = through_the_wire(padded_batch(batch, lengths))
    listed = ragged_tree(tree, pad=False)
    assert [a.tolist() for a in listed["tokens"]] == [s["tokens"].tolist() for s in batch]
    assert listed["label"].tolist() == list(range(len(lengths)))
    assert listed["fixed"].shape == (len(lengths), 3)  # not length-led: stacked as ever
    assert listed["name"] == [s["name"] for s in batch]
    padded = ragged_tree(tree, pad=True)["tokens"]
    assert isinstance(padded, Padded)  # also when every length is the same: one type
    assert padded.values.shape == (len(lengths), max(lengths), 1)
    assert padded.lengths.tolist() == lengths
    for row, sample in enumerate(batch):
        n = lengths[row]
        assert (padded.values[row, :n] == sample["tokens"]).all()
        assert not padded.values[row, n:].any() and padded.mask[row].tolist() == (
            [True] * n + [False] * (max(lengths) - n))


def test_arrays_of_other_shapes_than_their_lengths_are_refused_clearly() -> None:
    batch = [{"x": np.zeros(2), "n": 3}, {"x": np.zeros(4), "n": 3}]
    with pytest.raises(ProtocolError, match="expected the samples of one batch to share one "
                                            "structure"):
        padded_batch(batch, [3, 3])
