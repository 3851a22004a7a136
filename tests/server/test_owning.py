"""Items made the server's own as drawn: a streamer reusing its arrays or dicts never
changes a sample already drawn, whichever way (stacked as drawn, or copied) it took."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import feedmux
from feedmux.protocol import Data, SampleBatch, decode
from feedmux.sampling import EpochIterator
from feedmux.server._delivery.outbox import Frames
from feedmux.server._sources.owning import STACK_AS_DRAWN_BYTES, DrawnItems
from feedmux.server._sources.policy import BatchPolicy
from feedmux.server._sources.producer import produce

pytestmark = pytest.mark.timeout(20)


def produced(make: Callable[[], Iterator[Any]], *, per_message: int | None = 4,
             copy_arrays: bool = True) -> list[Any]:
    """Every sample of one epoch, decoded only after the whole epoch was drawn."""
    kept: list[Frames] = []

    def send(frames: Frames, n_samples: int, epoch: int) -> bool:
        kept.append(frames)
        return True

    produce(EpochIterator(feedmux.Streamer(make), max_epochs=1), send,
            policy=BatchPolicy(samples_per_message=per_message, copy_arrays=copy_arrays),
            server_id="test")
    samples: list[Any] = []
    for frames in kept:
        message = decode(frames)
        assert isinstance(message, Data)
        samples.extend(message.samples)
    return samples


def reusing_one_dict(count: int, shape: tuple[int, ...] = (3,)) -> Iterator[dict[str, Any]]:
    buffer = np.empty(shape, np.float32)
    sample: dict[str, Any] = {}
    for index in range(count):
        buffer[...] = index
        sample["x"] = buffer
        sample["y"] = np.int64(index)
        sample["name"] = f"s{index}"
        yield sample


def check(samples: list[Any], count: int) -> None:
    assert [int(sample["y"]) for sample in samples] == list(range(count))
    assert [sample["name"] for sample in samples] == [f"s{i}" for i in range(count)]
    assert all((sample["x"] == int(sample["y"])).all() for sample in samples)


@pytest.mark.parametrize("per_message", [None, 1, 4, 7])
def test_small_samples_in_one_reused_dict_and_array_arrive_intact(per_message: int | None) -> None:
    check(produced(lambda: reusing_one_dict(30), per_message=per_message), 30)


def test_large_samples_in_one_reused_array_arrive_intact() -> None:
    elements = STACK_AS_DRAWN_BYTES // 4 + 1  # too big to stack as drawn: copied one by one
    check(produced(lambda: reusing_one_dict(9, (elements,))), 9)


def test_the_zero_copy_option_sends_views_that_a_reusing_streamer_changes() -> None:
    samples = produced(lambda: reusing_one_dict(8), copy_arrays=False)
    assert {float(sample["x"][0]) for sample in samples} != set(range(8))


def test_samples_of_another_shape_keep_their_place_and_values() -> None:
    buffer = np.empty(3, np.float32)

    def mixed() -> Iterator[Any]:
        for index in range(24):
            buffer[:] = index
            if index % 5 == 2:
                yield {"y": np.int64(index), "x": buffer, "name": f"s{index}"}  # keys reordered
            elif index % 7 == 3:
                yield {"x": np.full(2, index, np.float32), "y": np.int64(index),
                       "name": f"s{index}"}  # another shape
            elif index % 11 == 4:
                yield [buffer, index]  # not a dict
            else:
                yield {"x": buffer, "y": np.int64(index), "name": f"s{index}"}

    samples = produced(mixed, per_message=6)
    assert len(samples) == 24
    for index, sample in enumerate(samples):
        if isinstance(sample, list):
            assert (sample[0] == index).all() and sample[1] == index
            continue
        assert int(sample["y"]) == index and (sample["x"] == index).all()
        expected = ["y", "x", "name"] if index % 5 == 2 else ["x", "y", "name"]
        assert list(sample) == expected


def test_a_chunk_of_one_shape_is_one_batch_and_the_next_shape_gets_its_own_rows() -> None:
    drawn = DrawnItems()
    buffer = np.zeros((2, 2), np.int16)

    def chunk(values: list[Any]) -> Any:
        hook = drawn.start()
        items = []
        for value in values:
            buffer[...] = value
            items.append(hook({"a": buffer.T, "b": value, "c": np.float32(value)}))
        return drawn.samples(items)

    first = chunk([1, 2, 3])
    assert isinstance(first, SampleBatch)
    assert first.stacked()["a"].tolist() == [[[1, 1], [1, 1]], [[2, 2], [2, 2]], [[3, 3], [3, 3]]]
    assert first.stacked()["b"] == [1, 2, 3] and first.stacked()["c"].dtype == np.float32
    buffer = np.zeros(5, np.int16)  # another shape: the first chunk's rows do not fit
    second = chunk([4, 5])
    assert isinstance(second, list) and [int(s["a"][0]) for s in second] == [4, 5]
    third = chunk([6, 7])  # rows of the new shape
    assert isinstance(third, SampleBatch) and third.stacked()["a"].shape == (2, 5)


def test_numpy_scalars_of_one_type_but_another_dtype_are_not_stacked_together() -> None:
    drawn = DrawnItems()
    hook = drawn.start()
    items = [hook({"s": np.str_("a")}), hook({"s": np.str_("abc")})]
    samples = drawn.samples(items)
    assert [sample["s"] for sample in samples] == ["a", "abc"]
    assert [sample["s"].dtype.itemsize for sample in samples] == [4, 12]


@pytest.mark.parametrize("values", [
    [np.int64(1), np.int32(2), np.int64(3)],  # the type fixes the dtype: checked by type
    [np.float32(1), np.float64(2), np.float32(3)],
    [np.datetime64(1, "D"), np.datetime64(2, "s"), np.datetime64(3, "D")],  # the unit counts
], ids=["int", "float", "datetime-unit"])
def test_a_scalar_of_another_dtype_is_not_stacked_with_the_others(values: list[Any]) -> None:
    drawn = DrawnItems()
    hook = drawn.start()
    drawn.samples([hook({"s": values[0]})])  # a chunk that gives the rows their shape
    hook = drawn.start()  # the next chunk runs the compiled check
    items = [hook({"s": value}) for value in values]
    samples = drawn.samples(items)
    assert isinstance(samples, list)
    assert [(type(s["s"]), s["s"].dtype) for s in samples] == [(type(v), v.dtype) for v in values]


@pytest.mark.parametrize("scalar_type", [np.bool_, np.uint8, np.int64, np.float16, np.longdouble,
                                         np.complex64])
def test_numpy_scalars_stacked_as_drawn_arrive_with_their_type_and_value(scalar_type: Any) -> None:
    def labelled() -> Iterator[dict[str, Any]]:
        for index in range(9):
            yield {"x": np.full(2, index, np.float32), "label": scalar_type(index % 2)}

    samples = produced(labelled, per_message=3)
    assert [type(sample["label"]) for sample in samples] == [scalar_type] * 9
    assert [sample["label"] for sample in samples] == [scalar_type(i % 2) for i in range(9)]
