"""Training batches (protocol side): every number stacked, the tree kept, through the codec."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedmux.errors import ProtocolError
from feedmux.protocol import (
    Data,
    SampleBatch,
    decode,
    encode,
    stacked_tree,
    take_rows,
    training_batch,
)


def through_the_wire(samples: list[Any]) -> Any:
    """The batch tree a trainer gets for ``samples`` sent as one batch."""
    tags = np.zeros((len(samples), 2), dtype=np.int64)
    tags[:, 0], tags[:, 1] = 1, np.arange(len(samples))
    message = decode(encode(Data(tags, training_batch(samples), "s")))
    assert isinstance(message, Data)
    return stacked_tree(message.samples)


def test_plain_numbers_become_one_dimensional_arrays() -> None:
    samples = [{"i": i, "f": i / 2, "b": i % 2 == 0, "m": i if i else 0.5, "s": f"n{i}",
                "z": None} for i in range(4)]
    tree = through_the_wire(samples)
    assert tree["i"].dtype == np.int64 and tree["i"].tolist() == [0, 1, 2, 3]
    assert tree["f"].dtype == np.float64 and tree["f"].tolist() == [0, 0.5, 1, 1.5]
    assert tree["b"].dtype == np.bool_ and tree["b"].tolist() == [True, False, True, False]
    assert tree["m"].dtype == np.float64  # ints and floats mixed: floats
    assert tree["s"] == ["n0", "n1", "n2", "n3"] and tree["z"] == [None] * 4


def test_an_int_beyond_int64_stays_a_python_int() -> None:
    tree = through_the_wire([{"big": 1 << 63}, {"big": 1}])  # msgpack carries up to 2**64-1
    assert tree["big"] == [1 << 63, 1]


def test_nested_dicts_tuples_and_lists_keep_their_nesting() -> None:
    samples = [({"x": np.full((2, 3), i, np.float32), "k": np.int16(i)},
                [np.uint8(i), float(i), "t"]) for i in range(5)]
    tree = through_the_wire(samples)
    assert type(tree) is tuple and type(tree[0]) is dict and type(tree[1]) is list
    assert tree[0]["x"].shape == (5, 2, 3) and tree[0]["x"].dtype == np.float32
    assert tree[0]["x"][3].tolist() == np.full((2, 3), 3).tolist()
    assert tree[0]["k"].dtype == np.int16 and tree[0]["k"].tolist() == list(range(5))
    assert tree[1][0].dtype == np.uint8 and tree[1][1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert tree[1][2] == ["t"] * 5


def test_a_batch_of_one_is_a_batch_too() -> None:
    tree = through_the_wire([{"x": np.arange(3), "y": 7}])
    assert tree["x"].shape == (1, 3) and tree["y"].tolist() == [7]


def test_a_zero_d_array_leaf_stacks_into_a_one_d_array() -> None:
    tree = through_the_wire([{"x": np.array(float(i))} for i in range(3)])
    assert tree["x"].shape == (3,) and tree["x"].tolist() == [0.0, 1.0, 2.0]


def test_samples_of_different_structure_are_refused_naming_the_first_that_differs() -> None:
    samples = [{"x": np.zeros(3)}, {"x": np.zeros(3)}, {"x": np.zeros(4)}]
    with pytest.raises(ProtocolError, match=r"sample 2 of 3 \({'x': float64\[4\]}\) unlike "
                                            r"sample 0 \({'x': float64\[3\]}\)"):
        training_batch(samples)
    with pytest.raises(ProtocolError, match="at least one sample"):
        training_batch([])


def test_a_decoded_batch_is_taken_as_it_is() -> None:
    batch = training_batch([{"x": np.arange(2) + i} for i in range(3)])
    assert type(batch) is SampleBatch
    again = training_batch(batch)
    assert again.stacked()["x"] is batch.stacked()["x"]  # no copy, no sample built


def test_take_rows_by_index_and_by_slice() -> None:
    tree = through_the_wire([([np.full(2, i), f"s{i}"], {"y": i}) for i in range(5)])
    picked = take_rows(tree, [4, 1])
    assert picked[0][0].tolist() == [[4, 4], [1, 1]] and picked[0][1] == ["s4", "s1"]
    assert picked[1]["y"].tolist() == [4, 1]
    sliced = take_rows(tree, slice(1, 3))
    assert sliced[0][0].base is not None  # a view of the message's array
    assert sliced[0][1] == ["s1", "s2"] and sliced[1]["y"].tolist() == [1, 2]
