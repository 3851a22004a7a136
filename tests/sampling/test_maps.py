"""buffer_stream, tuples and keras_tuples."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pescador
import pytest

from feedmux.errors import DataError, SamplingError
from feedmux.sampling import Streamer, buffer_stream, keras_tuples, tuples

# Every test here is fast: a hang is a bug, so fail it early.
pytestmark = pytest.mark.timeout(30)



def items(n: int) -> Iterator[dict[str, np.ndarray]]:
    for i in range(n):
        yield {"x": np.full((2, 3), i), "y": np.asarray(i % 2)}


def test_buffer_stream_stacks_along_a_new_axis() -> None:
    batches = list(buffer_stream(items(7), 3))
    assert len(batches) == 2  # the partial batch of 1 is dropped
    assert batches[0]["x"].shape == (3, 2, 3)
    np.testing.assert_array_equal(batches[1]["y"], [1, 0, 1])
    np.testing.assert_array_equal(batches[1]["x"][:, 0, 0], [3, 4, 5])


def test_buffer_stream_partial_keeps_the_last_batch() -> None:
    batches = list(buffer_stream(items(7), 3, partial=True))
    assert [len(batch["y"]) for batch in batches] == [3, 3, 1]
    assert list(buffer_stream(items(0), 3, partial=True)) == []


def test_buffer_stream_concatenates_along_an_axis() -> None:
    batches = buffer_stream(buffer_stream(items(8), 2), 2, axis=0)
    first = next(batches)
    assert first["x"].shape == (4, 2, 3)
    np.testing.assert_array_equal(first["y"], [0, 1, 0, 1])
    wide = next(buffer_stream([{"x": item["x"]} for item in items(2)], 2, axis=1))
    assert wide["x"].shape == (2, 6)


def test_buffer_stream_matches_pescador() -> None:
    stream = Streamer(items, 10)
    for size, axis in [(3, None), (5, None), (2, 0)]:
        source = list(buffer_stream(stream, 1)) if axis == 0 else list(stream)
        ours = list(buffer_stream(source, size, axis=axis))
        theirs = list(pescador.buffer_stream(source, size, axis=axis))
        assert len(ours) == len(theirs)
        for mine, reference in zip(ours, theirs, strict=True):
            assert mine.keys() == reference.keys()
            for key in mine:
                np.testing.assert_array_equal(mine[key], reference[key])
                assert mine[key].dtype == reference[key].dtype


def test_buffer_stream_over_a_streamer_and_scalars() -> None:
    stream = Streamer([{"a": 1.5, "b": "s"}, {"a": 2.5, "b": "t"}])
    batch = next(buffer_stream(stream, 2))
    np.testing.assert_array_equal(batch["a"], [1.5, 2.5])
    assert batch["b"].tolist() == ["s", "t"]


def test_mismatched_shapes_name_the_key_and_the_shapes() -> None:
    bad = [{"x": np.zeros(3)}, {"x": np.zeros(4)}]
    with pytest.raises(
        DataError, match=r"cannot stack key 'x' of items 0\.\.1: shapes \[\(3,\), \(4,\)\]"
    ):
        next(buffer_stream(bad, 2))
    with pytest.raises(DataError, match=r"concatenate along axis=0 key 'x'.*\(\)"):
        next(buffer_stream([{"x": np.asarray(1)}, {"x": np.asarray(2)}], 2, axis=0))
    with pytest.raises(DataError, match=r"items 2\.\.3: shapes \[\(1,\), \(2,\)\]"):
        list(buffer_stream([{"x": 1}, {"x": 2}, {"x": [1]}, {"x": [1, 2]}], 2))


def test_items_that_are_not_dicts_or_differ_in_keys_raise_data_errors() -> None:
    with pytest.raises(DataError, match=r"cannot batch item 1, 5 \(int\)"):
        next(buffer_stream([{"x": 1}, 5], 2))
    with pytest.raises(DataError, match=r"item 1: its keys \['y'\] differ"):
        next(buffer_stream([{"x": 1}, {"y": 2}], 2))


@pytest.mark.parametrize("size", [0, -1, 1.5, "2", True])
def test_bad_buffer_size_is_rejected_at_the_call(size: object) -> None:
    with pytest.raises(SamplingError, match="buffer_size must be an int >= 1"):
        buffer_stream([], size)  # type: ignore[arg-type]


def test_bad_axis_is_rejected_at_the_call() -> None:
    with pytest.raises(SamplingError, match="axis must be None or an int"):
        buffer_stream([], 2, axis="0")  # type: ignore[arg-type]


def test_tuples() -> None:
    stream = [{"a": 1, "b": 2, "c": 3}, {"a": 4, "b": 5, "c": 6}]
    assert list(tuples(stream, "c", "a")) == [(3, 1), (6, 4)]
    assert list(tuples(stream, "b")) == [(2,), (5,)]
    assert list(tuples(stream, "c", "a")) == list(pescador.tuples(iter(stream), "c", "a"))


def test_tuples_errors() -> None:
    with pytest.raises(SamplingError, match="at least one key"):
        tuples([{"a": 1}])
    with pytest.raises(DataError, match=r"item 1 has no key 'b'; its keys are \['a'\]"):
        list(tuples([{"b": 1}, {"a": 1}], "b"))
    with pytest.raises(DataError, match=r"item 0, 3 \(int\), is not a dict"):
        list(tuples([3], "a"))


@pytest.mark.parametrize(
    "inputs, outputs, expected",
    [
        ("a", "b", (1, 2)),
        (["a"], ["b", "c"], ([1], [2, 3])),
        ("a", None, (1, None)),
        (None, ["c"], (None, [3])),
        (("a", "b"), "c", ([1, 2], 3)),
    ],
)
def test_keras_tuples(inputs: object, outputs: object, expected: tuple[object, object]) -> None:
    stream = [{"a": 1, "b": 2, "c": 3}]
    assert next(keras_tuples(stream, inputs, outputs)) == expected  # type: ignore[arg-type]
    if not isinstance(inputs, tuple):  # pescador fails on a tuple of keys
        assert next(pescador.keras_tuples(iter(stream), inputs, outputs)) == expected


def test_keras_tuples_errors() -> None:
    with pytest.raises(SamplingError, match="at least one key in inputs or outputs"):
        keras_tuples([{"a": 1}])
    with pytest.raises(SamplingError, match="inputs must be None, a key or a list"):
        keras_tuples([{"a": 1}], inputs=3)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="no key 'z'"):
        next(keras_tuples([{"a": 1}], inputs="a", outputs="z"))


def test_maps_are_lazy_and_hold_one_batch() -> None:
    pulled = []

    def source() -> Iterator[dict[str, int]]:
        for i in range(100):
            pulled.append(i)
            yield {"x": i}

    batches = buffer_stream(source(), 4)
    next(batches)
    assert len(pulled) == 4
